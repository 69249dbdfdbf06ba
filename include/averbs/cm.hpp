// SPDX-License-Identifier: MIT
/// @file
/// Connection management: IP addressing, listeners and connectors (IB CM
/// over QP1 with rdma_cm's addressing; see docs/cm.md).
#pragma once

#include <averbs/cm/address.hpp>
#include <averbs/cm/connector.hpp>
#include <averbs/cm/listener.hpp>
#include <averbs/verbs.hpp>
