// SPDX-License-Identifier: MIT
// averbs devices: what ibv_devinfo shows, for averbs devices, in its format
// (rdma-core libibverbs/examples/devinfo.c) so scripts that parse one parse
// the other.
#include "averbs/commands.hpp"

#include <averbs/verbs.hpp>

#include <cstdio>
#include <cstring>
#include <string>

namespace averbs::cli {

namespace {

std::string guid_str(std::uint64_t g) {
  char b[32];
  std::snprintf(b, sizeof b, "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48) & 0xFFFF,
                static_cast<unsigned>(g >> 32) & 0xFFFF, static_cast<unsigned>(g >> 16) & 0xFFFF,
                static_cast<unsigned>(g) & 0xFFFF);
  return b;
}

const char* port_state_str(port_state s) {
  switch (s) {
    case port_state::down: return "PORT_DOWN";
    case port_state::init: return "PORT_INIT";
    case port_state::armed: return "PORT_ARMED";
    case port_state::active: return "PORT_ACTIVE";
    case port_state::active_defer: return "PORT_ACTIVE_DEFER";
    default: return "PORT_NOP";
  }
}

const char* mtu_str(mtu m) {
  switch (m) {
    case mtu::mtu_256: return "256";
    case mtu::mtu_512: return "512";
    case mtu::mtu_1024: return "1024";
    case mtu::mtu_2048: return "2048";
    case mtu::mtu_4096: return "4096";
  }
  return "invalid MTU";
}

const char* speed_str(unsigned s) {
  switch (s) {
    case 1: return "2.5 Gbps";
    case 2: return "5.0 Gbps";
    case 4:
    case 8: return "10.0 Gbps";
    case 16: return "14.0 Gbps";
    case 32: return "25.0 Gbps";
    case 64: return "50.0 Gbps";
    case 128: return "100.0 Gbps";
    case 256: return "200.0 Gbps";
  }
  return "invalid speed";
}

const char* width_str(std::uint8_t w) {
  switch (w) {
    case 1: return "1";
    case 2: return "4";
    case 4: return "8";
    case 8: return "12";
    case 16: return "2";
  }
  return "invalid width";
}

const char* phys_state_str(std::uint8_t s) {
  switch (s) {
    case 1: return "SLEEP";
    case 2: return "POLLING";
    case 3: return "DISABLED";
    case 4: return "PORT_CONFIGURATION TRAINNING";
    case 5: return "LINK_UP";
    case 6: return "LINK_ERROR_RECOVERY";
    case 7: return "PHY TEST";
  }
  return "invalid physical state";
}

void print_cap_flags(std::uint32_t f) {
  static const char* names[] = {"RESIZE_MAX_WR",      "BAD_PKEY_CNTR",     "BAD_QKEY_CNTR",  "RAW_MULTI",
                                "AUTO_PATH_MIG",      "CHANGE_PHY_PORT",   "UD_AV_PORT_ENFORCE",
                                "CURR_QP_STATE_MOD",  "SHUTDOWN_PORT",     "INIT_TYPE",      "PORT_ACTIVE_EVENT",
                                "SYS_IMAGE_GUID",     "RC_RNR_NAK_GEN",    "SRQ_RESIZE",     "N_NOTIFY_CQ"};
  std::uint32_t known = 0;
  for (unsigned i = 0; i < 15; ++i) {
    if (f & (1u << i)) std::printf("\t\t\t\t\t%s\n", names[i]);
    known |= 1u << i;
  }
  const struct {
    std::uint32_t bit;
    const char* name;
  } more[] = {{1u << 17, "MEM_WINDOW"},         {1u << 18, "UD_IP_CSUM"},         {1u << 20, "XRC"},
              {1u << 21, "MEM_MGT_EXTENSIONS"}, {1u << 23, "MEM_WINDOW_TYPE_2A"}, {1u << 24, "MEM_WINDOW_TYPE_2B"},
              {1u << 25, "RC_IP_CSUM"},         {1u << 26, "RAW_IP_CSUM"},        {1u << 29, "MANAGED_FLOW_STEERING"}};
  for (auto& m : more) {
    if (f & m.bit) std::printf("\t\t\t\t\t%s\n", m.name);
    known |= m.bit;
  }
  if (f & ~known) std::printf("\t\t\t\t\tUnknown flags: 0x%X\n", f & ~known);
}

int print_device(context& ctx, const std::string& name, bool verbose, int only_port) {
  std::error_code ec;
  device d;
  try {
    d = open_device(ctx, name);  // (the throwing form says which line or value is wrong)
  } catch (const std::system_error& e) {
    // A device named for another process or host (a devices.conf that a
    // server and a client share): its address is in use here, or not an
    // address of this host.  Not an error of this listing.
    if (e.code() == std::errc::address_in_use || e.code() == std::errc::address_not_available) {
      std::printf("hca_id:\t%s\n\t(not opened: %s; another process's or another host's device)\n\n",
                  name.c_str(), e.code().message().c_str());
      return 0;
    }
    std::fprintf(stderr, "Failed to open device %s: %s\n", name.c_str(), e.what());
    return 1;
  }
  const device_attr a = d.query(ec);
  if (ec) {
    std::fprintf(stderr, "Failed to query device props: %s\n", ec.message().c_str());
    return 1;
  }
  std::printf("hca_id:\t%s\n", name.c_str());
  std::printf("\ttransport:\t\t\t%s (%d)\n", "InfiniBand", 0);
  if (!a.fw_ver.empty()) std::printf("\tfw_ver:\t\t\t\t%s\n", a.fw_ver.c_str());
  std::printf("\tnode_guid:\t\t\t%s\n", guid_str(a.node_guid).c_str());
  std::printf("\tsys_image_guid:\t\t\t%s\n", guid_str(a.sys_image_guid).c_str());
  std::printf("\tvendor_id:\t\t\t0x%04x\n", a.vendor_id);
  std::printf("\tvendor_part_id:\t\t\t%d\n", a.vendor_part_id);
  std::printf("\thw_ver:\t\t\t\t0x%X\n", a.hw_ver);
  std::printf("\tphys_port_cnt:\t\t\t%d\n", a.phys_port_cnt);
  if (verbose) {
    std::printf("\tmax_mr_size:\t\t\t0x%llx\n", static_cast<unsigned long long>(a.max_mr_size));
    std::printf("\tpage_size_cap:\t\t\t0x%llx\n", static_cast<unsigned long long>(a.page_size_cap));
    std::printf("\tmax_qp:\t\t\t\t%d\n", a.max_qp);
    std::printf("\tmax_qp_wr:\t\t\t%d\n", a.max_qp_wr);
    std::printf("\tdevice_cap_flags:\t\t0x%08x\n", a.device_cap_flags);
    print_cap_flags(a.device_cap_flags);
    std::printf("\tdevice_cap_flags_ex:\t\t0x%llX\n", static_cast<unsigned long long>(a.device_cap_flags_ex));
    if ((a.device_cap_flags_ex & device_cap_atomic_write) != 0) std::printf("\t\t\t\t\tATOMIC_WRITE\n");
    std::printf("\tmax_sge:\t\t\t%d\n", a.max_sge);
    std::printf("\tmax_sge_rd:\t\t\t%d\n", a.max_sge_rd);
    std::printf("\tmax_cq:\t\t\t\t%d\n", a.max_cq);
    std::printf("\tmax_cqe:\t\t\t%d\n", a.max_cqe);
    std::printf("\tmax_mr:\t\t\t\t%d\n", a.max_mr);
    std::printf("\tmax_pd:\t\t\t\t%d\n", a.max_pd);
    std::printf("\tmax_qp_rd_atom:\t\t\t%d\n", a.max_qp_rd_atom);
    std::printf("\tmax_ee_rd_atom:\t\t\t%d\n", a.max_ee_rd_atom);
    std::printf("\tmax_res_rd_atom:\t\t%d\n", a.max_res_rd_atom);
    std::printf("\tmax_qp_init_rd_atom:\t\t%d\n", a.max_qp_init_rd_atom);
    std::printf("\tmax_ee_init_rd_atom:\t\t%d\n", a.max_ee_init_rd_atom);
    const char* atomic = a.atomic_cap == 0 ? "ATOMIC_NONE" : a.atomic_cap == 1 ? "ATOMIC_HCA" : "ATOMIC_GLOB";
    std::printf("\tatomic_cap:\t\t\t%s (%d)\n", atomic, a.atomic_cap);
    std::printf("\tmax_ee:\t\t\t\t%d\n", a.max_ee);
    std::printf("\tmax_rdd:\t\t\t%d\n", a.max_rdd);
    std::printf("\tmax_mw:\t\t\t\t%d\n", a.max_mw);
    std::printf("\tmax_raw_ipv6_qp:\t\t%d\n", a.max_raw_ipv6_qp);
    std::printf("\tmax_raw_ethy_qp:\t\t%d\n", a.max_raw_ethy_qp);
    std::printf("\tmax_mcast_grp:\t\t\t%d\n", a.max_mcast_grp);
    std::printf("\tmax_mcast_qp_attach:\t\t%d\n", a.max_mcast_qp_attach);
    std::printf("\tmax_total_mcast_qp_attach:\t%d\n", a.max_total_mcast_qp_attach);
    std::printf("\tmax_ah:\t\t\t\t%d\n", a.max_ah);
    std::printf("\tmax_fmr:\t\t\t%d\n", 0);
    std::printf("\tmax_srq:\t\t\t%d\n", a.max_srq);
    if (a.max_srq != 0) {
      std::printf("\tmax_srq_wr:\t\t\t%d\n", a.max_srq_wr);
      std::printf("\tmax_srq_sge:\t\t\t%d\n", a.max_srq_sge);
    }
    std::printf("\tmax_pkeys:\t\t\t%d\n", a.max_pkeys);
    std::printf("\tlocal_ca_ack_delay:\t\t%d\n", a.local_ca_ack_delay);
  }
  for (std::uint8_t port = 1; port <= a.phys_port_cnt; ++port) {
    if (only_port != 0 && port != only_port) continue;
    const port_attr p = d.query_port(port, ec);
    if (ec) {
      std::fprintf(stderr, "Failed to query port %u props: %s\n", port, ec.message().c_str());
      return 1;
    }
    std::printf("\t\tport:\t%u\n", port);
    std::printf("\t\t\tstate:\t\t\t%s (%d)\n", port_state_str(p.state), static_cast<int>(p.state));
    std::printf("\t\t\tmax_mtu:\t\t%s (%d)\n", mtu_str(p.max_mtu), static_cast<int>(p.max_mtu));
    std::printf("\t\t\tactive_mtu:\t\t%s (%d)\n", mtu_str(p.active_mtu), static_cast<int>(p.active_mtu));
    std::printf("\t\t\tsm_lid:\t\t\t%d\n", p.sm_lid);
    std::printf("\t\t\tport_lid:\t\t%d\n", p.lid);
    std::printf("\t\t\tport_lmc:\t\t0x%02x\n", p.lmc);
    std::printf("\t\t\tlink_layer:\t\t%s\n", p.link_layer == link_layer::ethernet ? "Ethernet" : "InfiniBand");
    if (verbose) {
      std::printf("\t\t\tmax_msg_sz:\t\t0x%x\n", p.max_msg_sz);
      std::printf("\t\t\tport_cap_flags:\t\t0x%08x\n", p.port_cap_flags);
      std::printf("\t\t\tport_cap_flags2:\t0x%04x\n", 0);
      std::printf("\t\t\tmax_vl_num:\t\t%s (%d)\n", p.max_vl_num == 1 ? "1" : "?", p.max_vl_num);
      std::printf("\t\t\tbad_pkey_cntr:\t\t0x%x\n", p.bad_pkey_cntr);
      std::printf("\t\t\tqkey_viol_cntr:\t\t0x%x\n", p.qkey_viol_cntr);
      std::printf("\t\t\tsm_sl:\t\t\t%d\n", p.sm_sl);
      std::printf("\t\t\tpkey_tbl_len:\t\t%d\n", p.pkey_tbl_len);
      std::printf("\t\t\tgid_tbl_len:\t\t%d\n", p.gid_tbl_len);
      std::printf("\t\t\tsubnet_timeout:\t\t%d\n", p.subnet_timeout);
      std::printf("\t\t\tinit_type_reply:\t%d\n", p.init_type_reply);
      std::printf("\t\t\tactive_width:\t\t%sX (%d)\n", width_str(p.active_width), p.active_width);
      std::printf("\t\t\tactive_speed:\t\t%s (%d)\n", speed_str(p.active_speed), p.active_speed);
      std::printf("\t\t\tphys_state:\t\t%s (%d)\n", phys_state_str(p.phys_state), p.phys_state);
      const auto gids = d.gids();
      for (std::size_t i = 0; i < gids.size(); ++i) {
        if (gids[i].is_zero()) continue;
        std::printf("\t\t\tGID[%3zu]:\t\t%s, RoCE v2\n", i, gids[i].to_string().c_str());
      }
    }
    std::printf("\n");
  }
  return 0;
}

int help() {
  std::printf(
      "usage: averbs devices [-d DEVICE] [-i PORT] [-l] [-v]\n\n"
      "Prints averbs devices as ibv_devinfo prints RDMA devices.\n\n"
      "  -d, --ib-dev=DEVICE   only this device\n"
      "  -i, --ib-port=PORT    only this port\n"
      "  -l, --list            print device names only\n"
      "  -v, --verbose         print all attributes and the GID table\n");
  return 0;
}

}  // namespace

int cmd_devices(std::span<char* const> args) {
  bool verbose = false, list = false;
  std::string only;
  int port = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    auto value = [&](const char* opt) -> std::string {
      const std::string eq = std::string(opt) + "=";
      if (a.rfind(eq, 0) == 0) return a.substr(eq.size());
      if (i + 1 < args.size()) return args[++i];
      std::fprintf(stderr, "averbs devices: %s needs a value\n", opt);
      std::exit(2);
    };
    if (a == "-h" || a == "--help") return help();
    if (a == "-v" || a == "--verbose") verbose = true;
    else if (a == "-l" || a == "--list") list = true;
    else if (a == "-d" || a == "--ib-dev" || a.rfind("--ib-dev=", 0) == 0) {
      only = value(a == "-d" ? "-d" : "--ib-dev");
      if (only.empty()) {  // not "every device"
        std::fprintf(stderr, "averbs devices: --ib-dev needs a device name\n");
        return 2;
      }
    } else if (a == "-i" || a == "--ib-port" || a.rfind("--ib-port=", 0) == 0) {
      // ibv_devinfo refuses a port under 1; one past the device's ports
      // prints the device without ports, as ibv_devinfo does.
      const std::string v = value(a == "-i" ? "-i" : "--ib-port");
      std::int64_t n = 0;
      if (!parse_number(v, 1, 255, n)) {
        std::fprintf(stderr, "averbs devices: --ib-port: '%s' is not a port number from 1 to 255\n",
                     v.c_str());
        return 2;
      }
      port = static_cast<int>(n);
    } else {
      std::fprintf(stderr, "averbs devices: unknown option '%s'\n", a.c_str());
      return 2;
    }
  }
  const auto names = list_devices();
  // A source that cannot be read lists none of its devices: say why, and
  // end with status 1 after what was found.
  const auto broken = device_source_errors();
  for (const auto& why : broken) std::fprintf(stderr, "averbs devices: warning: %s\n", why.c_str());
  const int source_rc = broken.empty() ? 0 : 1;
  if (list) {
    std::printf("%zu HCA%s found:\n", names.size(), names.size() == 1 ? "" : "s");
    for (const auto& n : names) std::printf("\t%s\n", n.c_str());
    std::printf("\n");
    return source_rc;
  }
  context ctx;
  if (!only.empty()) {
    // Named by the environment or the configuration file, but wrongly (or
    // its address taken): opening it says why.
    try {
      (void)open_device(ctx, only);
    } catch (const std::system_error& e) {
      if (e.code() == errc::not_found)
        std::fprintf(stderr, "IB device '%s' wasn't found\n", only.c_str());
      else
        std::fprintf(stderr, "averbs devices: %s\n", e.what());
      return 255;
    }
    return print_device(ctx, only, verbose, port) | source_rc;
  }
  int rc = source_rc;
  for (const auto& n : names) rc |= print_device(ctx, n, verbose, port);
  return rc;
}

}  // namespace averbs::cli
