// SPDX-License-Identifier: MIT
#include <averbs/error.hpp>

#include <string>

namespace averbs {

namespace {

class errc_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "averbs"; }

  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::operation_aborted: return "operation aborted";
      case errc::invalid_argument: return "invalid argument";
      case errc::would_deadlock: return "synchronous call inside a completion handler";
      case errc::timed_out: return "timed out";
      case errc::not_supported: return "not supported";
      case errc::busy: return "object in use";
      case errc::no_resources: return "resource limit reached";
      case errc::not_found: return "not found";
      case errc::device_removed: return "device removed";
      case errc::permission_denied: return "permission denied";
      case errc::invalid_state: return "invalid state for this operation";
      case errc::alerted: return "alertable wait ran completion handlers";
      case errc::queue_full: return "queue full";
      case errc::address_unreachable: return "address unreachable";
      case errc::connection_refused: return "connection refused: nothing listening";
      case errc::connection_rejected: return "connection rejected by the remote application";
      case errc::connection_reset: return "connection reset by peer";
      case errc::address_in_use: return "address in use";
      case errc::protocol_error: return "protocol error";
      case errc::message_too_long: return "message too long";
      case errc::stale_handle: return "stale handle";
      case errc::already_exists: return "already exists";
      case errc::not_connected: return "not connected";
      case errc::bad_address: return "address range not mapped with the access asked for";
    }
    return "unknown averbs error " + std::to_string(ev);
  }

  std::error_condition default_error_condition(int ev) const noexcept override {
    switch (static_cast<errc>(ev)) {
      case errc::operation_aborted: return std::errc::operation_canceled;
      case errc::invalid_argument: return std::errc::invalid_argument;
      case errc::would_deadlock: return std::errc::resource_deadlock_would_occur;
      case errc::timed_out: return std::errc::timed_out;
      case errc::not_supported: return std::errc::operation_not_supported;
      case errc::busy: return std::errc::device_or_resource_busy;
      case errc::no_resources: return std::errc::not_enough_memory;
      case errc::not_found: return std::errc::no_such_file_or_directory;
      case errc::device_removed: return std::errc::no_such_device;
      case errc::permission_denied: return std::errc::permission_denied;
      case errc::invalid_state: return std::errc::invalid_argument;
      case errc::alerted: return std::errc::interrupted;
      case errc::queue_full: return std::errc::not_enough_memory;
      case errc::address_unreachable: return std::errc::host_unreachable;
      case errc::connection_refused: return std::errc::connection_refused;
      case errc::connection_rejected: return std::errc::connection_refused;
      case errc::connection_reset: return std::errc::connection_reset;
      case errc::address_in_use: return std::errc::address_in_use;
      case errc::protocol_error: return std::errc::protocol_error;
      case errc::message_too_long: return std::errc::message_size;
      case errc::stale_handle: return std::errc::bad_file_descriptor;
      case errc::already_exists: return std::errc::file_exists;
      case errc::not_connected: return std::errc::not_connected;
      case errc::bad_address: return std::errc::bad_address;
    }
    return {ev, *this};
  }
};

class wc_status_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "averbs.wc"; }
  std::string message(int ev) const override { return std::string(to_string(static_cast<wc_status>(ev))); }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const errc_category c;
  return c;
}

const std::error_category& wc_category() noexcept {
  static const wc_status_category c;
  return c;
}

std::string_view to_string(wc_status s) noexcept {
  // Wording of rdma-core's ibv_wc_status_str().
  switch (s) {
    case wc_status::success: return "success";
    case wc_status::loc_len_err: return "local length error";
    case wc_status::loc_qp_op_err: return "local QP operation error";
    case wc_status::loc_eec_op_err: return "local EE context operation error";
    case wc_status::loc_prot_err: return "local protection error";
    case wc_status::wr_flush_err: return "Work Request Flushed Error";
    case wc_status::mw_bind_err: return "memory management operation error";
    case wc_status::bad_resp_err: return "bad response error";
    case wc_status::loc_access_err: return "local access error";
    case wc_status::rem_inv_req_err: return "remote invalid request error";
    case wc_status::rem_access_err: return "remote access error";
    case wc_status::rem_op_err: return "remote operation error";
    case wc_status::retry_exc_err: return "transport retry counter exceeded";
    case wc_status::rnr_retry_exc_err: return "RNR retry counter exceeded";
    case wc_status::loc_rdd_viol_err: return "local RDD violation error";
    case wc_status::rem_inv_rd_req_err: return "remote invalid RD request";
    case wc_status::rem_abort_err: return "aborted error";
    case wc_status::inv_eecn_err: return "invalid EE context number";
    case wc_status::inv_eec_state_err: return "invalid EE context state";
    case wc_status::fatal_err: return "fatal error";
    case wc_status::resp_timeout_err: return "response timeout error";
    case wc_status::general_err: return "general error";
    case wc_status::tm_err: return "TM error";
    case wc_status::tm_rndv_incomplete: return "TM software rendezvous";
  }
  return "unknown";
}

void throw_error(const std::error_code& ec, const char* what) { throw std::system_error(ec, what); }

}  // namespace averbs
