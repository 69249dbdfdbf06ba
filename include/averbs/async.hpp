// SPDX-License-Identifier: MIT
/// @file
/// The asynchronous request core: contexts, requests, completion ports,
/// groups, completion tokens and the no-op operation.
#pragma once

#include <averbs/async/clock.hpp>
#include <averbs/async/completion_port.hpp>
#include <averbs/async/context.hpp>
#include <averbs/async/initiate.hpp>
#include <averbs/async/nop.hpp>
#include <averbs/async/request.hpp>
#include <averbs/async/request_group.hpp>
#include <averbs/async/tokens.hpp>
#include <averbs/error.hpp>
