// SPDX-License-Identifier: MIT
// The process's device registry: `embedded` (created on first use) and the
// devices soft_device objects register.
#include "verbs/objects.hpp"
#include "verbs/registry.hpp"

#include <averbs/error.hpp>
#include <averbs/verbs/soft_device.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string_view>
#include <unordered_map>

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

// `where` names the source in every message: "soft_device" (the API),
// "AVERBS_DEVICES", or the configuration file's "path:line".
std::shared_ptr<device_entry> make_entry(const soft_device_options& o, const std::string& where) {
  auto e = std::make_shared<device_entry>();
  e->name = o.name;
  soft::device_config cfg;
  cfg.name = o.name;
  cfg.clock = o.clock;
  cfg.gids = o.gids;
  if (!o.address.empty() && o.address.find('%') != std::string::npos)
    bad_option(
        where + ": address '" + o.address +
        "' has an IPv6 zone (%...), which a device address cannot have: give a global or unique-local one");
  if (!o.address.empty() && !gid::parse(o.address, cfg.address))
    bad_option(where + ": address '" + o.address + "' is not an IPv4 or IPv6 address");
  if (!o.address.empty()) {
    // A device sends from its address and puts it in every ICRC: the
    // wildcard (it would bind every address and compute ICRCs with a
    // source the kernel replaces) and group addresses (no source of a
    // datagram) cannot be one.
    if (cfg.address.is_unspecified())
      bad_option(where + ": address '" + o.address + "' is unspecified (the wildcard)");
    if (cfg.address.is_group())
      bad_option(where + ": address '" + o.address + "' is a multicast or broadcast address");
    // Port 0 would bind an ephemeral port no peer knows to send to.
    if (o.port == 0)
      bad_option(where + ": port 0 (a device needs a known RoCE port; 4791 is the standard one)");
  }
  cfg.port = o.port;
  cfg.check_icrc = o.check_icrc;
  cfg.first_qpn = o.first_qpn;
  cfg.raw_send = o.raw_send;
  cfg.gso = o.gso;
  std::string error;
  if (!o.faults.empty() && !soft::parse_faults(o.faults, cfg.faults, error))
    bad_option(where + ": faults: " + error);
  try {
    e->engine = std::make_shared<soft::device>(cfg);
  } catch (const std::system_error& x) {
    // The socket calls' errors ("bind: Address already in use") say
    // neither which device nor which address: this does, keeping the code.
    std::string what = where + ": device '" + o.name + "'";
    if (!o.address.empty()) {
      const bool v6 = o.address.find(':') != std::string::npos;
      what += " at " + (v6 ? "[" + o.address + "]" : o.address) + ":" + std::to_string(o.port);
    }
    if (x.code() == std::errc::address_not_available) what += ", not an address of this host";
    // (system_error appends the code's message to what it is given.)
    std::string call = x.what();
    const std::string tail = ": " + x.code().message();
    if (call.size() >= tail.size() && call.compare(call.size() - tail.size(), tail.size(), tail) == 0)
      call.resize(call.size() - tail.size());
    throw std::system_error(x.code(), what + ": " + call);
  }
  return e;
}

// "a.b.c.d", "a.b.c.d:port", "[v6]:port" or a bare IPv6 address.
void split_address(const std::string& text, soft_device_options& o, const std::string& where) {
  std::string addr = text;
  std::uint16_t port = 4791;
  // Digits only (no sign, no spaces), as --addr takes them.
  auto parse_port = [&](const std::string& p) {
    if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
      bad_option(where + ": bad port '" + p + "'");
    const unsigned long v = std::stoul(p);
    if (v < 1 || v > 65535) bad_option(where + ": bad port '" + p + "'");
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

/// One device the environment or the configuration file names.  What is
/// wrong with the source as a whole (its syntax, a file that cannot be
/// read) is an error for every device it would name; what is wrong with
/// one entry is that device's business, an error when it is opened.
struct named_device {
  std::string name;
  std::string address;               // as written ("" if missing)
  std::vector<std::string> options;  // the configuration file's words after the address
  std::string where;                 // "AVERBS_DEVICES" or "path:line"
  std::string also;                  // where the same source names it again, if it does
};

bool has_space(std::string_view s) { return s.find_first_of(" \t\r\n\v\f") != std::string_view::npos; }

// A control character other than a tab (a separator).
bool has_control(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && c != '\t') || u == 0x7F;
  });
}

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n\v\f");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n\v\f") - b + 1);
}

// A name given twice in one source is an error for that name (which entry
// was meant?), wherever the two are.
void mark_repeats(std::vector<named_device>& v) {
  std::unordered_map<std::string_view, std::size_t> first;  // name -> its first entry
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto [at, fresh] = first.emplace(v[i].name, i);
    if (fresh) continue;
    named_device& f = v[at->second];
    v[i].also = f.where;
    if (f.also.empty()) f.also = v[i].where;
  }
}

// AVERBS_DEVICES="name@address[:port],...": devices a program finds by name
// without creating them itself (the tools, unmodified applications).
// Spaces around an item, its name or its address are ignored.
std::vector<named_device> environment_devices() {
  std::vector<named_device> v;
  const char* env = std::getenv("AVERBS_DEVICES");
  if (env == nullptr || trim(env).empty()) return v;
  std::string_view rest = env;
  for (bool more = true; more;) {
    const auto comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    more = comma != std::string_view::npos;
    rest = more ? rest.substr(comma + 1) : std::string_view{};
    if (item.empty() && !more) break;  // one trailing comma
    // (A control character -- a NUL cuts a C string short -- is never
    // part of a name or an address.)
    if (has_control(item)) bad_option("AVERBS_DEVICES: an item holds a control character");
    const auto at = item.find('@');
    const std::string_view name = trim(item.substr(0, at));
    if (at == std::string_view::npos || name.empty() || has_space(name))
      bad_option("AVERBS_DEVICES: '" + std::string(item) +
                 "' is not name@address[:port] (items separated by commas)");
    if (name == "embedded")
      bad_option("AVERBS_DEVICES: 'embedded' is the name of the in-process device; give this one another");
    v.push_back({std::string(name), std::string(trim(item.substr(at + 1))), {}, "AVERBS_DEVICES", {}});
  }
  mark_repeats(v);
  return v;
}

// The device configuration file: $AVERBS_CONFIG, else /etc/averbs/devices.conf
// (whose absence means no devices).  One device per line, '#' starts a
// comment:
//
//   # name   address[:port]     options
//   udp0     127.0.0.2:4791     faults=drop=0.01,seed=3  icrc=1  raw=1
//   v6dev    [fd00::1]:4791
//
// Options: faults=SPEC (as AVERBS_FAULTS), icrc=0|1 (check received
// ICRCs), raw=0|1 (send through a raw socket when permitted), gso=0|1
// (send runs of packets as UDP GSO datagrams).  A regular file of at most
// 1 MiB: opened without blocking and checked before it is read, so a FIFO
// or a device file named by mistake cannot hang the program (this runs
// under the registry's lock).
std::vector<named_device> config_devices() {
  constexpr std::size_t max_size = std::size_t{1} << 20;
  const char* env = std::getenv("AVERBS_CONFIG");
  const std::string path = env != nullptr ? env : "/etc/averbs/devices.conf";
  const std::string what = (env != nullptr ? "AVERBS_CONFIG: '" : "'") + path + "'";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT && env == nullptr) return {};
    bad_option(what + ": " + std::generic_category().message(errno));
  }
  std::string text;
  struct stat st {};
  // A regular file, or a character device (/dev/null: "no devices"; read
  // without blocking and no further than the size limit).
  const bool regular = ::fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode));
  bool read_error = false;
  if (regular) {
    text.resize(S_ISREG(st.st_mode)
                    ? std::min<std::size_t>(static_cast<std::size_t>(st.st_size), max_size) + 1
                    : max_size + 1);
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        read_error = n < 0;
        break;
      }
      got += static_cast<std::size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  if (!regular) bad_option(what + " is not a regular file");
  if (read_error) bad_option(what + ": read error");
  if (text.size() > max_size) bad_option(what + " is larger than 1 MiB");

  // A UTF-8 byte-order mark (an editor's) is not part of the first name.
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);
  std::vector<named_device> v;
  std::istringstream lines(text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF
    std::istringstream words(line);
    named_device d;
    if (!(words >> d.name)) continue;
    d.where = path + ":" + std::to_string(n);
    // Anywhere on the line: a NUL would cut an address or port short, read
    // as the rest of a C string.
    if (has_control(line)) bad_option(d.where + ": the line holds a control character");
    if (d.name == "embedded")
      bad_option(d.where + ": 'embedded' is the name of the in-process device; give this one another");
    words >> d.address;
    for (std::string opt; words >> opt;) d.options.push_back(opt);
    v.push_back(std::move(d));
  }
  mark_repeats(v);
  return v;
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

// A named device's options.  AVERBS_FAULTS, AVERBS_ICRC and AVERBS_GSO
// apply to every device AVERBS_DEVICES names.
soft_device_options options_of(const named_device& d) {
  if (!d.also.empty()) bad_option(d.where + ": '" + d.name + "' is named twice (also " + d.also + ")");
  if (d.address.empty()) bad_option(d.where + ": '" + d.name + "' needs an address");
  soft_device_options o;
  o.name = d.name;
  split_address(d.address, o, d.where);
  std::vector<std::string> given;
  for (const std::string& opt : d.options) {
    const auto eq = opt.find('=');
    const std::string key = opt.substr(0, eq), value = eq == std::string::npos ? "" : opt.substr(eq + 1);
    // Each once: the last of two would win in silence ("icrc=0 icrc=1").
    if (eq != std::string::npos && std::find(given.begin(), given.end(), key) != given.end())
      bad_option(d.where + ": option '" + key + "' is given twice");
    given.push_back(key);
    if (key == "faults" && eq != std::string::npos && value.empty())
      bad_option(d.where + ": 'faults=' needs a specification (drop=0.01,... as AVERBS_FAULTS)");
    if (key == "faults" && !value.empty())
      o.faults = value;
    else if (key == "icrc" && (value == "0" || value == "1"))
      o.check_icrc = value == "1";
    else if (key == "raw" && (value == "0" || value == "1"))
      o.raw_send = value == "1";
    else if (key == "gso" && (value == "0" || value == "1"))
      o.gso = value == "1";
    else
      bad_option(d.where + ": unknown option '" + opt + "' (faults=SPEC, icrc=0|1, raw=0|1, gso=0|1)");
  }
  if (d.where == "AVERBS_DEVICES") {
    if (const char* f = std::getenv("AVERBS_FAULTS")) {
      // Checked here, to name the variable the error is in.
      soft::fault_config unused;
      std::string error;
      if (*f != 0 && !soft::parse_faults(f, unused, error)) bad_option("AVERBS_FAULTS: " + error);
      o.faults = f;
    }
    o.check_icrc = switch_from_environment("AVERBS_ICRC", o.check_icrc);
    o.gso = switch_from_environment("AVERBS_GSO", o.gso);
  }
  return o;
}

}  // namespace

std::shared_ptr<device_entry> find_device(const std::string& name) {
  const std::string n = name.empty() ? std::string("embedded") : name;
  registry& r = reg();
  std::lock_guard lock(r.mu);
  auto it = r.devices.find(n);
  if (it != r.devices.end()) return it->second;
  const auto add = [&](std::shared_ptr<device_entry> e) {
    r.devices.emplace(n, e);
    return e;
  };
  if (n == "embedded") return add(make_entry({.name = "embedded"}, "embedded"));
  // The environment names devices ahead of the configuration file.
  for (const named_device& d : environment_devices())
    if (d.name == n) return add(make_entry(options_of(d), d.where));
  for (const named_device& d : config_devices())
    if (d.name == n) return add(make_entry(options_of(d), d.where));
  return nullptr;
}

std::shared_ptr<device_entry> register_device(const soft_device_options& o) {
  if (o.name.empty() || o.name == "embedded") throw std::system_error(make_error_code(errc::invalid_argument), "soft_device name");
  registry& r = reg();
  std::lock_guard lock(r.mu);
  if (r.devices.count(o.name) != 0) throw std::system_error(make_error_code(errc::already_exists), o.name);
  auto e = make_entry(o, "soft_device");
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
  // environment ahead of the configuration file.  A source that cannot be
  // read names nothing here; opening a device says why.
  const auto add = [&](const named_device& d) {
    if (known.count(d.name) != 0) return;
    known_device k{d.name, nullptr, {}};
    try {
      // The address alone: a device whose options are wrong still owns
      // it, and opening it by address says what is wrong (it used to be
      // passed over for the embedded device, in silence).
      soft_device_options o;
      if (!d.address.empty()) split_address(d.address, o, d.where);
      gid::parse(o.address, k.address);
    } catch (const std::system_error&) {
      // Broken: listed without an address; opening it says why.
    }
    known[d.name] = std::move(k);
  };
  for (auto* source : {&environment_devices, &config_devices}) {
    try {
      for (const named_device& d : source()) add(d);
    } catch (const std::system_error&) {
    }
  }
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

std::vector<std::string> device_source_errors() {
  std::vector<std::string> v;
  for (auto* source : {&detail::environment_devices, &detail::config_devices}) {
    try {
      (void)source();
    } catch (const std::system_error& e) {
      v.push_back(e.what());
    }
  }
  return v;
}

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
