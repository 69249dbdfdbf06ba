// SPDX-License-Identifier: MIT
// The soft device's limits, reported by query_device and enforced by the
// engine.  Values follow rxe 6.x (rxe_param.h), so programs tuned for rxe
// fit.
#pragma once

#include <cstdint>

namespace averbs::soft::limits {

inline constexpr std::uint32_t max_qp = (1u << 20) - 16;
inline constexpr std::uint32_t qpn_base = 16;  // rxe starts data QPs at 16
// A device numbers its QPs from a random first QPN in [qpn_base,
// qpn_first_max]: a process that restarts with the same device (same GUID)
// must not reuse the QPNs its peers still hold in CM timewait or as
// connected (IBTA 12.9.8.3 rejects such a REQ as stale), as rxe's cyclic
// QPN allocation, kept in the kernel across processes, avoids too.
inline constexpr std::uint32_t qpn_first_max = (1u << 24) - (1u << 20) - 1;
inline constexpr std::uint32_t max_qp_wr = 1u << 20;
inline constexpr std::uint32_t max_sge = 32;
inline constexpr std::uint32_t max_sge_rd = 32;
inline constexpr std::uint32_t max_inline_data = 512;  // 32 SGEs worth, as rxe
inline constexpr std::uint32_t max_cq = 1u << 20;
// rxe's (MW, type 2B, SRQ resize, ...) but for AUTO_PATH_MIG (0x10): no
// alternate path on RoCE, so nothing migrates.
inline constexpr std::uint32_t device_cap_flags = 0x01223c66;
inline constexpr std::uint32_t max_cqe = (1u << 15) - 1;
inline constexpr std::uint32_t max_mr = 524287;
inline constexpr std::uint32_t max_mw = 524287;
inline constexpr std::uint32_t max_pd = 1u << 20;
inline constexpr std::uint32_t max_ah = 32767;
inline constexpr std::uint32_t max_srq = 917503;
inline constexpr std::uint32_t max_srq_wr = 1u << 20;
inline constexpr std::uint32_t max_srq_sge = 27;
inline constexpr std::uint32_t max_qp_rd_atom = 128;
inline constexpr std::uint32_t max_res_rd_atom = 0x3f000;
inline constexpr std::uint64_t max_mr_size = ~std::uint64_t{0};
inline constexpr std::uint32_t max_msg_size = 0x80000000;  // 2 GiB, as rxe since 6.12
inline constexpr std::uint64_t page_size_cap = 0xfffff000;
inline constexpr std::uint32_t gid_table_len = 1024;
inline constexpr std::uint16_t pkey_table_len = 1;
inline constexpr std::uint8_t local_ca_ack_delay = 15;
inline constexpr std::uint32_t vendor_id = 0xFFFFFF;

// Transport window (rxe): unacknowledged PSNs and packets between AckReqs.
inline constexpr std::uint32_t max_unacked_psns = 128;
// Memory keys: a freed key's index is reused only after this many others
// are free (oldest first, as rxe's pools hand out indices in turn), and
// with a random key byte: a peer holding a stale R_Key does not meet the
// next region registered (the old rule, last freed first and the byte
// counting up, gave the same key back every 256 registrations).
inline constexpr std::size_t key_reuse_distance = 1024;

// Tail probes per progress (docs/wire.md), each waiting twice as long as
// the one before: at 1, 3 and 7 probe delays (1/64 of the timeout, at
// least 250 us), inside the timeout but for the shortest timeouts.
inline constexpr std::uint8_t max_tail_probes = 3;
inline constexpr std::uint32_t max_pkts_per_ack = 64;
// Request packets a responder keeps while it answers a READ (the requests
// behind it; past this they are dropped and resent).  A requester's own
// window bounds them: 128 PSNs here, rxe's is similar.
inline constexpr std::uint32_t max_held_requests = 1024;
// Go-back-N resends a requester starts, without counting them against
// retry_cnt, for sequence NAKs that repeat the same PSN (each means the
// last resend was lost too).  Past this the timer alone retries, counted,
// so a peer that NAKs forever ends in retry_exc_err.
inline constexpr std::uint8_t max_nak_retries = 16;

}  // namespace averbs::soft::limits
