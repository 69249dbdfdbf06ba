// SPDX-License-Identifier: MIT
// Rule 1: the error model.
#include <averbs/async.hpp>
#include <averbs/error.hpp>

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <system_error>

namespace {

using averbs::errc;
using averbs::wc_status;

TEST(error, errc_matches_std_errc_conditions) {
  EXPECT_EQ(make_error_code(errc::invalid_argument), std::errc::invalid_argument);
  EXPECT_EQ(make_error_code(errc::operation_aborted), std::errc::operation_canceled);
  EXPECT_EQ(make_error_code(errc::timed_out), std::errc::timed_out);
  EXPECT_EQ(make_error_code(errc::would_deadlock), std::errc::resource_deadlock_would_occur);
  EXPECT_EQ(make_error_code(errc::busy), std::errc::device_or_resource_busy);
  EXPECT_EQ(make_error_code(errc::connection_refused), std::errc::connection_refused);
  EXPECT_EQ(make_error_code(errc::device_removed), std::errc::no_such_device);
  EXPECT_EQ(make_error_code(errc::bad_address), std::errc::bad_address);
  EXPECT_NE(make_error_code(errc::invalid_argument), std::errc::timed_out);
}

TEST(error, errc_has_its_own_category_and_messages) {
  const std::error_code ec = errc::would_deadlock;
  EXPECT_STREQ(ec.category().name(), "averbs");
  EXPECT_EQ(ec.message(), "synchronous call inside a completion handler");
  EXPECT_EQ(ec, errc::would_deadlock);
  EXPECT_NE(std::error_code(errc::busy), std::error_code(EBUSY, std::generic_category()))
      << "codes differ; conditions compare equal";
}

TEST(error, wc_status_is_numbered_like_ibv_wc_status) {
  EXPECT_EQ(static_cast<int>(wc_status::success), IBV_WC_SUCCESS);
  EXPECT_EQ(static_cast<int>(wc_status::loc_len_err), IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::loc_qp_op_err), IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::loc_prot_err), IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::wr_flush_err), IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::mw_bind_err), IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::bad_resp_err), IBV_WC_BAD_RESP_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::loc_access_err), IBV_WC_LOC_ACCESS_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::rem_inv_req_err), IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::rem_access_err), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::rem_op_err), IBV_WC_REM_OP_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::retry_exc_err), IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::rnr_retry_exc_err), IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::rem_abort_err), IBV_WC_REM_ABORT_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::fatal_err), IBV_WC_FATAL_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::resp_timeout_err), IBV_WC_RESP_TIMEOUT_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::general_err), IBV_WC_GENERAL_ERR);
  EXPECT_EQ(static_cast<int>(wc_status::tm_rndv_incomplete), IBV_WC_TM_RNDV_INCOMPLETE);
}

TEST(error, wc_status_strings_match_rdma_core) {
  for (int s = IBV_WC_SUCCESS; s <= IBV_WC_TM_RNDV_INCOMPLETE; ++s) {
    EXPECT_EQ(averbs::to_string(static_cast<wc_status>(s)),
              std::string_view(ibv_wc_status_str(static_cast<ibv_wc_status>(s))))
        << "status " << s;
  }
  const std::error_code ec = wc_status::rem_access_err;
  EXPECT_STREQ(ec.category().name(), "averbs.wc");
}

TEST(error, sync_pair_throws_or_reports_the_same_error) {
  averbs::context ctx;
  averbs::nop_params p;
  p.error = errc::permission_denied;
  std::error_code ec;
  EXPECT_EQ(averbs::nop(ctx, p, ec), 0u);
  EXPECT_EQ(ec, errc::permission_denied);
  try {
    averbs::nop(ctx, p);
    FAIL() << "expected std::system_error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::permission_denied);
  }
  p.error.clear();
  p.value = 42;
  EXPECT_EQ(averbs::nop(ctx, p, ec), 42u);
  EXPECT_FALSE(ec);
  EXPECT_EQ(averbs::nop(ctx, p), 42u);
}

}  // namespace
