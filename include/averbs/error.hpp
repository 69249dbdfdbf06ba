// SPDX-License-Identifier: MIT
/// @file
/// averbs error model: `averbs::errc` for API and resource errors and
/// `averbs::wc_status` for work-completion status, both usable as
/// `std::error_code`.
///
/// `errc` values compare equal to the `std::errc` condition that describes them
/// where one fits (`ec == std::errc::invalid_argument`), so code written
/// against POSIX conditions keeps working.  `wc_status` is numbered exactly
/// like rdma-core's `enum ibv_wc_status`, so converting is a cast.
#pragma once

#include <cstdint>
#include <string_view>
#include <system_error>

namespace averbs {

/// API, resource and protocol errors reported by averbs operations.
enum class errc : int {
  /// The request was cancelled, or its owning object was destroyed while it
  /// was pending.  Condition: `std::errc::operation_canceled`.
  operation_aborted = 1,
  /// An argument was out of range, inconsistent or malformed.
  invalid_argument = 2,
  /// A synchronous call or blocking wait was made inside a completion handler
  /// (the "dispatch level" rule).  Condition: `resource_deadlock_would_occur`.
  would_deadlock = 3,
  /// A wait or a protocol exchange ran out of time.
  timed_out = 4,
  /// The operation or the requested feature is not supported.
  not_supported = 5,
  /// The object is in use (for example a PD with live children).
  busy = 6,
  /// A resource limit (entries, objects, memory) was reached.
  no_resources = 7,
  /// No object with that name, key or handle exists.
  not_found = 8,
  /// The device was removed; the handle stays valid but can do nothing.
  device_removed = 9,
  /// Access flags or a key do not permit the operation.
  permission_denied = 10,
  /// The object is not in a state that allows the operation (for example a QP
  /// state transition that the IBTA state table does not list).
  invalid_state = 11,
  /// An alertable wait returned because completion handlers ran.
  alerted = 12,
  /// A work queue or completion queue is full.
  queue_full = 13,
  /// The address is unknown or cannot be reached.
  address_unreachable = 14,
  /// Nothing is listening at the remote address (CM REJ "invalid service ID").
  connection_refused = 15,
  /// The remote application rejected the connection (CM REJ "consumer defined").
  connection_rejected = 16,
  /// The peer disconnected or vanished.
  connection_reset = 17,
  /// The local address and port are already bound.
  address_in_use = 18,
  /// A peer sent something the protocol does not allow.
  protocol_error = 19,
  /// A message exceeds the size the transport or buffer allows.
  message_too_long = 20,
  /// A handle refers to an object that no longer exists.
  stale_handle = 21,
  /// An object with that identity already exists.
  already_exists = 22,
  /// The operation needs a connection that does not exist yet.
  not_connected = 23,
  /// The address range is not mapped in the process, or not with the
  /// access asked for (`EFAULT`: `ibv_reg_mr` of memory that is not there).
  bad_address = 24,
};

/// Work-completion status, numbered exactly like rdma-core's `ibv_wc_status`.
enum class wc_status : int {
  success = 0,
  loc_len_err = 1,
  loc_qp_op_err = 2,
  loc_eec_op_err = 3,
  loc_prot_err = 4,
  wr_flush_err = 5,
  mw_bind_err = 6,
  bad_resp_err = 7,
  loc_access_err = 8,
  rem_inv_req_err = 9,
  rem_access_err = 10,
  rem_op_err = 11,
  retry_exc_err = 12,
  rnr_retry_exc_err = 13,
  loc_rdd_viol_err = 14,
  rem_inv_rd_req_err = 15,
  rem_abort_err = 16,
  inv_eecn_err = 17,
  inv_eec_state_err = 18,
  fatal_err = 19,
  resp_timeout_err = 20,
  general_err = 21,
  tm_err = 22,
  tm_rndv_incomplete = 23,
};

/// The category of `averbs::errc`.  Defined out of line so that a module
/// using it never owns a unique symbol (which would make it undeletable).
const std::error_category& error_category() noexcept;

/// The category of `averbs::wc_status`.
const std::error_category& wc_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

inline std::error_code make_error_code(wc_status s) noexcept {
  return {static_cast<int>(s), wc_category()};
}

/// The IBTA name of a status, as `ibv_wc_status_str()` prints it.
std::string_view to_string(wc_status s) noexcept;

/// Throws `std::system_error(ec, what)`; used by the throwing overloads.
[[noreturn]] void throw_error(const std::error_code& ec, const char* what);

}  // namespace averbs

template <>
struct std::is_error_code_enum<averbs::errc> : std::true_type {};

template <>
struct std::is_error_code_enum<averbs::wc_status> : std::true_type {};
