// SPDX-License-Identifier: MIT
/// @file
/// The verbs API: devices and their objects.
#pragma once

#include <averbs/async.hpp>
#include <averbs/verbs/ah.hpp>
#include <averbs/verbs/cq.hpp>
#include <averbs/verbs/device.hpp>
#include <averbs/verbs/mr.hpp>
#include <averbs/verbs/mw.hpp>
#include <averbs/verbs/pd.hpp>
#include <averbs/verbs/qp.hpp>
#include <averbs/verbs/soft_device.hpp>
#include <averbs/verbs/srq.hpp>
#include <averbs/verbs/types.hpp>
