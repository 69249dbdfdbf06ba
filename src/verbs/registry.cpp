// SPDX-License-Identifier: MIT
// The process's device registry: `embedded` (created on first use) and the
// devices soft_device objects register.
#include "verbs/objects.hpp"
#include "verbs/registry.hpp"

#include <averbs/error.hpp>
#include <averbs/verbs/soft_device.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

namespace averbs {
namespace detail {

namespace {

struct registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<device_entry>> devices;  // Must hold mu.
};

registry& reg() {
  static registry* r = new registry;  // never destroyed: handles may outlive static destruction
  return *r;
}

[[noreturn]] void bad_option(const std::string& what) {
  throw std::system_error(make_error_code(errc::invalid_argument), what);
}

std::shared_ptr<device_entry> make_entry(const soft_device_options& o) {
  auto e = std::make_shared<device_entry>();
  e->name = o.name;
  soft::device_config cfg;
  cfg.name = o.name;
  cfg.clock = o.clock;
  cfg.gids = o.gids;
  if (!o.address.empty() && !gid::parse(o.address, cfg.address))
    bad_option("soft_device address '" + o.address + "' is not an IPv4 or IPv6 address");
  if (!o.address.empty()) {
    // A device sends from its address and puts it in every ICRC: the
    // wildcard (it would bind every address and compute ICRCs with a
    // source the kernel replaces) and group addresses (no source of a
    // datagram) cannot be one.
    const auto& a = cfg.address.raw;  // (unsigned char)
    const bool v4 = cfg.address.is_ipv4_mapped();
    const bool any = cfg.address.is_zero() || (v4 && a[12] == 0 && a[13] == 0 && a[14] == 0 && a[15] == 0);
    if (any) bad_option("soft_device address '" + o.address + "' is unspecified (the wildcard)");
    const bool multicast =
        v4 ? (a[12] & 0xF0) == 0xE0 || (a[12] == 0xFF && a[13] == 0xFF && a[14] == 0xFF && a[15] == 0xFF)
           : a[0] == 0xFF;
    if (multicast) bad_option("soft_device address '" + o.address + "' is a multicast or broadcast address");
  }
  cfg.port = o.port;
  cfg.check_icrc = o.check_icrc;
  cfg.first_qpn = o.first_qpn;
  cfg.raw_send = o.raw_send;
  cfg.gso = o.gso;
  std::string error;
  if (!o.faults.empty() && !soft::parse_faults(o.faults, cfg.faults, error)) bad_option("faults: " + error);
  e->engine = std::make_shared<soft::device>(cfg);
  return e;
}

// "a.b.c.d", "a.b.c.d:port", "[v6]:port" or a bare IPv6 address.
void split_address(const std::string& text, soft_device_options& o, const std::string& where) {
  std::string addr = text;
  std::uint16_t port = 4791;
  auto parse_port = [&](const std::string& p) {
    char* end = nullptr;
    const long v = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || v < 1 || v > 65535) bad_option(where + ": bad port '" + p + "'");
    return static_cast<std::uint16_t>(v);
  };
  if (!addr.empty() && addr.front() == '[') {
    const auto close = addr.find(']');
    if (close == std::string::npos) bad_option(where + ": bad address '" + addr + "'");
    if (close + 1 < addr.size()) {
      if (addr[close + 1] != ':') bad_option(where + ": bad address '" + addr + "'");
      port = parse_port(addr.substr(close + 2));
    }
    addr = addr.substr(1, close - 1);
  } else if (std::count(addr.begin(), addr.end(), ':') == 1) {
    port = parse_port(addr.substr(addr.find(':') + 1));
    addr = addr.substr(0, addr.find(':'));
  }
  // An empty address would make an in-process loopback device of a name
  // meant for the network.
  if (addr.empty()) bad_option(where + ": '" + text + "' has no address");
  o.address = addr;
  o.port = port;
}

// The device configuration file: $AVERBS_CONFIG, else /etc/averbs/devices.conf.
// One device per line, '#' starts a comment:
//
//   # name   address[:port]     options
//   udp0     127.0.0.2:4791     faults=drop=0.01,seed=3  icrc=1  raw=1
//   v6dev    [fd00::1]:4791
//
// Options: faults=SPEC (as AVERBS_FAULTS), icrc=0|1 (check received
// ICRCs), raw=0|1 (send through a raw socket when permitted), gso=0|1
// (send runs of packets as UDP GSO datagrams).
bool from_config_file(const std::string& name, soft_device_options& o, std::vector<std::string>* names) {
  const char* env = std::getenv("AVERBS_CONFIG");
  const std::string path = env != nullptr ? env : "/etc/averbs/devices.conf";
  std::ifstream in(path);
  std::error_code fs_ec;
  if (!in || std::filesystem::is_directory(path, fs_ec)) {  // (a directory opens, and reads as empty)
    if (env != nullptr && names == nullptr) bad_option("AVERBS_CONFIG: cannot read '" + path + "'");
    return false;
  }
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string dev, addr;
    if (!(words >> dev)) continue;
    const std::string where = path + ":" + std::to_string(n);
    // Another device's line, however broken, is that device's business:
    // opening it says what is wrong (as for a bad option or address).
    if (names == nullptr && dev != name) continue;
    if (!(words >> addr)) {
      if (names != nullptr) continue;  // listed without it; opening it says why
      bad_option(where + ": '" + dev + "' needs an address");
    }
    if (names != nullptr) {
      names->push_back(dev);
      continue;
    }
    o.name = dev;
    split_address(addr, o, where);
    for (std::string opt; words >> opt;) {
      const auto eq = opt.find('=');
      const std::string key = opt.substr(0, eq), value = eq == std::string::npos ? "" : opt.substr(eq + 1);
      if (key == "faults") o.faults = value;
      else if (key == "icrc" && (value == "0" || value == "1")) o.check_icrc = value == "1";
      else if (key == "raw" && (value == "0" || value == "1")) o.raw_send = value == "1";
      else if (key == "gso" && (value == "0" || value == "1")) o.gso = value == "1";
      else bad_option(where + ": unknown option '" + opt + "' (faults=, icrc=0|1, raw=0|1, gso=0|1)");
    }
    return true;
  }
  if (in.bad() && names == nullptr) bad_option(path + ": read error");  // not the end of the file
  return false;
}

// An on/off environment variable: 0 or 1, else an error (a "no" read as
// "on" would keep ICRC checks against a peer that cannot pass them).
bool switch_from_environment(const char* var, bool otherwise) {
  const char* v = std::getenv(var);
  if (v == nullptr) return otherwise;
  const std::string_view s = v;
  if (s != "0" && s != "1") bad_option(std::string(var) + ": '" + v + "' is neither 0 nor 1");
  return s == "1";
}

// AVERBS_DEVICES="name@address[:port],...": devices a program finds by name
// without creating them itself (the tools, unmodified applications).
// AVERBS_FAULTS and AVERBS_ICRC=0 apply to all of them.
bool from_environment(const std::string& name, soft_device_options& o) {
  const char* env = std::getenv("AVERBS_DEVICES");
  if (env == nullptr) return false;
  std::string_view rest = env;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const auto at = item.find('@');
    if (at == std::string_view::npos || item.substr(0, at) != name) continue;
    o.name = name;
    split_address(std::string(item.substr(at + 1)), o, "AVERBS_DEVICES");
    if (const char* f = std::getenv("AVERBS_FAULTS")) o.faults = f;
    o.check_icrc = switch_from_environment("AVERBS_ICRC", o.check_icrc);
    o.gso = switch_from_environment("AVERBS_GSO", o.gso);
    return true;
  }
  return false;
}

}  // namespace

std::shared_ptr<device_entry> find_device(const std::string& name) {
  const std::string n = name.empty() ? std::string("embedded") : name;
  registry& r = reg();
  std::lock_guard lock(r.mu);
  auto it = r.devices.find(n);
  if (it != r.devices.end()) return it->second;
  if (n == "embedded") {
    auto e = make_entry({.name = "embedded"});
    r.devices.emplace(n, e);
    return e;
  }
  // The environment names devices ahead of the configuration file.
  soft_device_options o;
  if (from_environment(n, o) || from_config_file(n, o, nullptr)) {
    auto e = make_entry(o);
    r.devices.emplace(n, e);
    return e;
  }
  return nullptr;
}

std::shared_ptr<device_entry> register_device(const soft_device_options& o) {
  if (o.name.empty() || o.name == "embedded") throw std::system_error(make_error_code(errc::invalid_argument), "soft_device name");
  registry& r = reg();
  std::lock_guard lock(r.mu);
  if (r.devices.count(o.name) != 0) throw std::system_error(make_error_code(errc::already_exists), o.name);
  auto e = make_entry(o);
  r.devices.emplace(o.name, e);
  return e;
}

void unregister_device(const std::shared_ptr<device_entry>& e) {
  {
    registry& r = reg();
    std::lock_guard lock(r.mu);
    r.devices.erase(e->name);
  }
  e->removed.store(true, std::memory_order_release);
  e->engine->fatal();
}

std::vector<known_device> known_devices() {
  std::map<std::string, known_device> known;
  {
    registry& r = reg();
    std::lock_guard lock(r.mu);
    for (auto& [name, e] : r.devices) known[name] = {name, e, {}};
  }
  // Named but not created: as find_device would create them, the
  // environment ahead of the configuration file.
  auto add = [&](const std::string& name, auto&& options_of) {
    if (name.empty() || known.count(name) != 0) return;
    known_device k{name, nullptr, {}};
    try {
      soft_device_options o;
      if (options_of(name, o)) gid::parse(o.address, k.address);
    } catch (const std::system_error&) {
      // Broken: listed without an address; opening it says why.
    }
    known[name] = std::move(k);
  };
  if (const char* env = std::getenv("AVERBS_DEVICES")) {
    std::string_view rest = env;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      if (const auto at = item.find('@'); at != std::string_view::npos)
        add(std::string(item.substr(0, at)), from_environment);
    }
  }
  std::vector<std::string> configured;
  try {
    soft_device_options unused;
    from_config_file("", unused, &configured);
  } catch (const std::system_error&) {
  }
  for (const std::string& n : configured)
    add(n,
        [](const std::string& name, soft_device_options& o) { return from_config_file(name, o, nullptr); });
  std::vector<known_device> v;
  v.push_back(known.count("embedded") != 0 ? known["embedded"] : known_device{"embedded", nullptr, {}});
  for (auto& [name, k] : known)  // (a map: by name)
    if (name != "embedded") v.push_back(std::move(k));
  return v;
}

std::vector<std::string> device_names() {
  std::vector<std::string> v;
  for (known_device& k : known_devices()) v.push_back(std::move(k.name));
  return v;
}

}  // namespace detail

std::vector<std::string> list_devices() { return detail::device_names(); }

struct soft_device::impl {
  std::shared_ptr<detail::device_entry> entry;
};

// The holder first: registered and then short of memory for it, the
// device would stay registered (its name taken, its descriptors open) with
// no object to remove it.
soft_device::soft_device(const soft_device_options& opts) : impl_(std::make_unique<impl>()) {
  impl_->entry = detail::register_device(opts);
}

soft_device::~soft_device() { detail::unregister_device(impl_->entry); }

const std::string& soft_device::name() const noexcept { return impl_->entry->name; }

void soft_device::set_port_state(port_state s) { impl_->entry->engine->set_port_state(s); }

void soft_device::set_faults(const std::string& spec) {
  soft::fault_config f;
  std::string error;
  if (!spec.empty() && !soft::parse_faults(spec, f, error)) detail::bad_option("faults: " + error);
  impl_->entry->engine->set_faults(f);
}

soft::device& soft_device::engine() const noexcept { return *impl_->entry->engine; }

}  // namespace averbs
