// SPDX-License-Identifier: MIT
// The connection-management API: addresses, resolution, and the bodies of
// the listener and connector operations (check, lock the device, hand to
// its manager, run the engine, unlock).
#include "cm/manager.hpp"
#include "verbs/objects.hpp"
#include "verbs/registry.hpp"

#include <averbs/cm.hpp>
#include <averbs/error.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

namespace averbs::cm {

namespace {
std::error_code err(errc e) { return make_error_code(e); }
}  // namespace

// ---------------------------------------------------------------------------
// address

bool address::is_any() const noexcept {
  if (ip.is_zero()) return true;
  if (!ip.is_ipv4_mapped()) return false;
  return ip.raw[12] == 0 && ip.raw[13] == 0 && ip.raw[14] == 0 && ip.raw[15] == 0;
}

std::string address::to_string() const {
  if (is_ipv4()) {
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, ip.raw.data() + 12, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(port);
  }
  return "[" + ip.to_string() + "]:" + std::to_string(port);
}

bool address::parse(std::string_view text, address& out) {
  std::string host(text);
  std::uint32_t port = 0;
  auto parse_port = [&](std::string_view p) {
    if (p.empty() || p.size() > 5) return false;
    port = 0;
    for (char ch : p) {
      if (ch < '0' || ch > '9') return false;
      port = port * 10 + static_cast<std::uint32_t>(ch - '0');
    }
    return port <= 65535;
  };
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return false;
    host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty() && (rest.front() != ':' || !parse_port(rest.substr(1)))) return false;
  } else if (const auto colon = text.find(':'); colon != std::string_view::npos &&
                                                text.find(':', colon + 1) == std::string_view::npos) {
    host = std::string(text.substr(0, colon));
    if (!parse_port(text.substr(colon + 1))) return false;
  }
  gid g;
  if (!gid::parse(host, g)) return false;
  out.ip = g;
  out.port = static_cast<std::uint16_t>(port);
  return true;
}

bool address::from_sockaddr(const sockaddr* sa, address& out) noexcept {
  if (sa == nullptr) return false;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    out.ip = gid::from_ipv4(ntohl(in->sin_addr.s_addr));
    out.port = ntohs(in->sin_port);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    // A scope (a link-local address's interface) has no place in an
    // address here, and dropped it would name another host.
    if (in6->sin6_scope_id != 0) return false;
    std::memcpy(out.ip.raw.data(), &in6->sin6_addr, 16);
    out.port = ntohs(in6->sin6_port);
    return true;
  }
  return false;
}

unsigned address::to_sockaddr(sockaddr_storage& out) const noexcept {
  std::memset(&out, 0, sizeof out);
  if (is_ipv4()) {
    auto* in = reinterpret_cast<sockaddr_in*>(&out);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, ip.raw.data() + 12, 4);
    in->sin_port = htons(port);
    return sizeof(sockaddr_in);
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&out);
  in6->sin6_family = AF_INET6;
  std::memcpy(&in6->sin6_addr, ip.raw.data(), 16);
  in6->sin6_port = htons(port);
  return sizeof(sockaddr_in6);
}

// ---------------------------------------------------------------------------
// Routes

namespace {

bool is_multicast(const gid& g) {
  if (g.is_ipv4_mapped()) return (g.raw[12] & 0xF0) == 0xE0;
  return g.raw[0] == 0xFF;
}

// Whether the host routes `dst` from source `src` (a UDP socket bound to
// `src` connects to it), and which source the host itself would pick.
// Answers are cached for a second: a pipelined connect storm asks the same
// question thousands of times.
struct route_cache {
  struct entry {
    bool ok;
    std::chrono::steady_clock::time_point when;
  };
  std::mutex mu;
  std::map<std::pair<std::array<std::uint8_t, 16>, std::array<std::uint8_t, 16>>, entry> map;  // Must hold mu.
};

route_cache& routes() {
  static route_cache* c = new route_cache;
  return *c;
}

bool is_loopback(const gid& g) {
  if (g.is_ipv4_mapped()) return g.raw[12] == 127;
  static const gid v6_loopback = [] {
    gid l;
    l.raw[15] = 1;
    return l;
  }();
  return g == v6_loopback;
}

bool host_routes(const gid& src, const gid& dst) {
  // A loopback source reaches only loopback: Linux refuses that route for
  // IPv4 (EINVAL) but lets an IPv6 socket bound to ::1 connect anywhere.
  if (is_loopback(src) != is_loopback(dst)) return false;
  const auto now = std::chrono::steady_clock::now();
  route_cache& rc = routes();
  {
    std::lock_guard lock(rc.mu);
    auto it = rc.map.find({src.raw, dst.raw});
    if (it != rc.map.end() && now - it->second.when < std::chrono::seconds(1)) return it->second.ok;
  }
  bool ok = false;
  const address s{src, 0}, d{dst, 9};
  sockaddr_storage ss, ds;
  const unsigned sl = s.to_sockaddr(ss), dl = d.to_sockaddr(ds);
  const int fd = ::socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    ok = ::bind(fd, reinterpret_cast<sockaddr*>(&ss), sl) == 0 &&
         ::connect(fd, reinterpret_cast<sockaddr*>(&ds), dl) == 0;
    ::close(fd);
  }
  std::lock_guard lock(rc.mu);
  if (rc.map.size() > 4096) rc.map.clear();
  rc.map[{src.raw, dst.raw}] = {ok, now};
  return ok;
}

// The source address the host picks for `dst`, or zero.
gid host_source(const gid& dst) {
  const address d{dst, 9};
  sockaddr_storage ds;
  const unsigned dl = d.to_sockaddr(ds);
  gid out{};
  const int fd = ::socket(ds.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ds), dl) == 0) {
    sockaddr_storage ls;
    socklen_t ll = sizeof ls;
    address a;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ls), &ll) == 0 &&
        address::from_sockaddr(reinterpret_cast<sockaddr*>(&ls), a))
      out = a.ip;
  }
  ::close(fd);
  return out;
}

// Devices this process has opened come first: a device named by the
// environment or the configuration file but not opened here may be another
// process's (a devices.conf shared by a client and a server), and creating
// it would bind its address.  Resolving (the way to a destination) goes:
// an opened device that owns the address (the embedded one last); an
// opened UDP device the host routes it from; a named one that routes it;
// the named owner; the embedded device, created now.  A client that resolves its server's address before
// opening anything so gets its own device, not the server's (which only a
// process serving there would open).  `own` asks for the owner of a local
// address to open: opened, then named, then embedded.  Only the device
// chosen is created; the embedded one (every host address, loopback only)
// comes after every configured one.
std::error_code find_route(const gid& ip, route& out, bool own) {
  if (ip.is_zero() || address{ip, 0}.is_any() || is_multicast(ip)) return err(errc::invalid_argument);
  struct candidate {
    std::string name;
    std::shared_ptr<averbs::detail::device_entry> e;  // null: not created yet
    std::vector<gid> table;
  };
  std::vector<candidate> udp, loop, named, embedded;
  for (averbs::detail::known_device& k : averbs::detail::known_devices()) {
    if (k.entry == nullptr) {
      if (!k.address.is_zero()) named.push_back({k.name, nullptr, {k.address}});
      continue;
    }
    if (k.entry->removed.load()) continue;
    auto& list = k.name == "embedded" ? embedded : k.entry->engine->udp_port() != 0 ? udp : loop;
    list.push_back({k.name, k.entry, k.entry->engine->gids()});
  }
  // Creates a named device when chosen; false if it cannot be (its address
  // taken by another process, say): the search goes on.  A device whose
  // configuration is wrong is remembered: the owner of a local address
  // must not quietly become the embedded device instead.
  // (One that could not be created for another reason, its address taken,
  // is the likelier owner: then the address is unreachable, as before.)
  std::error_code config_error;
  bool other_failure = false;
  auto create = [&config_error, &other_failure](candidate& c) {
    if (c.e != nullptr) return true;
    try {
      c.e = averbs::detail::find_device(c.name);
    } catch (const std::system_error& e) {
      if (e.code() != make_error_code(errc::invalid_argument))
        other_failure = true;
      else if (!config_error)
        config_error = e.code();
      return false;
    }
    return c.e != nullptr && !c.e->removed.load();
  };
  auto fill = [&](const candidate& c, const gid& sgid, bool local) {
    std::uint32_t index = 0;
    if (!c.e->engine->find_gid(sgid, index)) return false;
    out.device = c.name;
    out.port_num = 1;
    out.gid_index = index;
    out.sgid = sgid;
    out.dgid = ip;
    port_attr pa;
    out.path_mtu = c.e->engine->query_port(1, pa) ? mtu::mtu_1024 : pa.active_mtu;
    out.local = local;
    return true;
  };
  auto owner = [&](std::vector<candidate>& list) {
    for (candidate& c : list)
      if (std::find(c.table.begin(), c.table.end(), ip) != c.table.end() && create(c) && fill(c, ip, true))
        return true;
    return false;
  };
  // A UDP device the host routes the address from, the one holding the
  // host's preferred source first.  A device that owns the address is not
  // a route to it.
  auto router = [&, preferred = std::optional<gid>()](std::vector<candidate>& list) mutable {
    if (!preferred) preferred = host_source(ip);
    for (int pass = 0; pass < 2; ++pass) {
      for (candidate& c : list) {
        if (std::find(c.table.begin(), c.table.end(), ip) != c.table.end()) continue;
        for (const gid& g : c.table) {
          if (g.is_ipv4_mapped() != ip.is_ipv4_mapped()) continue;
          if (pass == 0 && !(g == *preferred)) continue;
          if (host_routes(g, ip) && create(c) && fill(c, g, false)) return true;
        }
      }
    }
    return false;
  };
  // An address a configured device claims is never the embedded device's
  // (whose table is every host address): a process that opened the
  // embedded device before still finds the configured owner, a route to
  // it, or its error -- not a device that reaches no other process.
  const bool claimed = [&] {
    for (const auto* list : {&udp, &loop, &named})
      for (const candidate& c : *list)
        if (std::find(c.table.begin(), c.table.end(), ip) != c.table.end()) return true;
    return false;
  }();
  // The embedded device, created if it is not yet (it binds nothing) and
  // only if it owns the address (its table is the host's addresses):
  // created by a search it cannot answer, it would come ahead of the
  // configured devices in later ones (an opened owner).
  auto embedded_owner = [&] {
    if (claimed) return false;
    if (embedded.empty()) {
      const std::vector<gid> host = averbs::soft::host_addresses();
      if (std::find(host.begin(), host.end(), ip) == host.end()) return false;
      auto e = averbs::detail::find_device("embedded");
      if (e == nullptr || e->removed.load()) return false;
      embedded.push_back({"embedded", e, e->engine->gids()});
    }
    return owner(embedded);
  };
  if (own) {
    if (owner(udp) || owner(loop) || owner(named)) return {};
    if (config_error && !other_failure) return config_error;  // (averbs devices -d NAME says what)
    return embedded_owner() ? std::error_code{} : err(errc::address_unreachable);
  }
  if (owner(udp) || owner(loop) || (!claimed && owner(embedded)) || router(udp) || router(named) ||
      owner(named))
    return {};
  if (config_error && !other_failure) return config_error;  // a route only a wrong entry would give
  return embedded_owner() ? std::error_code{} : err(errc::address_unreachable);
}

}  // namespace

namespace detail {

void start_resolve(context& ctx, const gid& ip, averbs::detail::completer<route> c) noexcept {
  (void)ctx;
  try {
    route r;
    if (auto ec = find_route(ip, r, false)) return void(c.fail(ec));
    c.complete({}, std::move(r));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_open_device(context& ctx, const gid& ip, averbs::detail::completer<device> c) noexcept {
  try {
    route r;
    if (auto ec = find_route(ip, r, true)) return void(c.fail(ec));
    if (!r.local) return void(c.fail(err(errc::address_unreachable)));
    averbs::detail::start_open_device(ctx, r.device, c);
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

}  // namespace detail

route resolve(context& ctx, const gid& ip) {
  return averbs::detail::sync_call<route>([&](auto t) { return async_resolve(ctx, ip, t); }, "averbs::cm::resolve");
}
route resolve(context& ctx, const gid& ip, std::error_code& ec) noexcept {
  return averbs::detail::sync_call<route>([&](auto t) { return async_resolve(ctx, ip, t); }, ec);
}
device open_device(context& ctx, const gid& local_ip) {
  return averbs::detail::sync_call<device>([&](auto t) { return async_open_device(ctx, local_ip, t); },
                                           "averbs::cm::open_device");
}
device open_device(context& ctx, const gid& local_ip, std::error_code& ec) noexcept {
  return averbs::detail::sync_call<device>([&](auto t) { return async_open_device(ctx, local_ip, t); }, ec);
}

// ---------------------------------------------------------------------------
// Connector

namespace detail {

namespace {

soft::device& engine(const connector_obj& o) { return *o.dev->eng; }

// Runs `fn` with the device locked, then lets the engine finish what it
// queued and releases what the manager dropped.
template <class Fn>
auto locked(soft::device& d, Fn&& fn) {
  struct after {
    soft::device& d;
    ~after() { d.drain_released(); }
  } a{d};
  std::lock_guard lock(d.lock());
  struct kick {
    soft::device& d;
    ~kick() { d.kick(); }
  } k{d};
  return fn();
}

// The QP behind a handle, if it is one of this connector's device.  Its
// engine object is read with live() while use_handles() is held.
std::error_code qp_of(const connector_obj& o, const qp& q, const averbs::detail::qp_obj*& out) {
  const auto& qo = averbs::detail::handle_access::obj(q);
  if (qo == nullptr) return err(errc::invalid_argument);
  if (qo->pd->dev->eng != o.dev->eng) return err(errc::invalid_argument);  // another device's QP
  out = qo.get();
  return {};
}

std::error_code unusable(const std::shared_ptr<connector_obj>& o) {
  if (o == nullptr) return err(errc::invalid_argument);
  if (o->dev->removed()) return err(errc::device_removed);
  return {};
}

}  // namespace

std::shared_ptr<connector_obj> make_connector(const device& d) {
  const auto& dobj = averbs::detail::handle_access::obj(d);
  if (dobj == nullptr) throw std::system_error(err(errc::invalid_argument), "averbs::cm::connector: empty device");
  auto o = std::make_shared<connector_obj>();
  o->dev = dobj;
  o->m = &manager_of(*dobj->eng);
  return o;
}

connector_obj::~connector_obj() {
  if (m == nullptr) return;
  soft::device& d = *dev->eng;
  {
    std::lock_guard lock(d.lock());
    if (c != nullptr) {
      m->release(c);
      c = nullptr;
      d.kick();
    }
  }
  d.drain_released();
}

context& context_of(const connector_obj* c) {
  if (c == nullptr) throw std::system_error(err(errc::invalid_argument), "empty averbs::cm::connector");
  return *c->dev->ctx;
}

void start_connect(const std::shared_ptr<connector_obj>& o, const qp& q, const address& to,
                   std::vector<std::byte> pdata, const conn_params& p,
                   averbs::detail::completer<connect_result> done) noexcept {
  if (auto ec = unusable(o)) return void(done.fail(ec));
  const averbs::detail::qp_obj* qo = nullptr;
  if (auto ec = qp_of(*o, q, qo)) return void(done.fail(ec));
  soft::device& d = engine(*o);
  // Bad arguments first: an unroutable wildcard is a bad argument, not an
  // unreachable address.
  const std::size_t pdata_max =
      qo->type == qp_type::ud ? max_ud_connect_private_data : max_connect_private_data;
  if (to.port == 0 || to.is_any() || pdata.size() > pdata_max)
    return void(done.fail(err(errc::invalid_argument)));
  // The host must route the peer from the device's address (a UDP device
  // reaching out of its own addresses).
  std::uint32_t idx;
  if (d.udp_port() != 0 && !to.ip.is_zero() && !d.find_gid(to.ip, idx)) {
    bool any = false;
    try {  // (the GID list is a copy, and the route cache may grow)
      for (const gid& g : d.gids())
        if (g.is_ipv4_mapped() == to.ip.is_ipv4_mapped() && host_routes(g, to.ip)) any = true;
    } catch (...) {
      return void(done.fail(err(errc::no_resources)));
    }
    if (!any) return void(done.fail(err(errc::address_unreachable)));
  }
  // A destroy of the QP on another thread comes before (stale_handle) or
  // after: then the manager has it attached and aborts the connect.
  const auto handles = averbs::detail::use_handles(*qo->pd->dev);
  soft::qp_t* qp = averbs::detail::live(qo->e);
  if (qp == nullptr) return void(done.fail(err(errc::stale_handle)));
  locked(d, [&] {
    o->m->connect(*o, qp, to, pdata, p, {&done.context(), done.id()});
    return 0;
  });
}

void start_accept(const std::shared_ptr<connector_obj>& o, const qp& q, std::vector<std::byte> pdata,
                  const conn_params& p, averbs::detail::completer<void> done) noexcept {
  if (auto ec = unusable(o)) return void(done.fail(ec));
  const averbs::detail::qp_obj* qo = nullptr;
  if (auto ec = qp_of(*o, q, qo)) return void(done.fail(ec));
  const auto handles = averbs::detail::use_handles(*qo->pd->dev);
  soft::qp_t* qp = averbs::detail::live(qo->e);
  if (qp == nullptr) return void(done.fail(err(errc::stale_handle)));
  locked(engine(*o), [&] {
    if (o->c == nullptr) done.fail(err(errc::invalid_state));  // not a passive connector
    else o->m->accept(o->c, qp, pdata, p, {&done.context(), done.id()});
    return 0;
  });
}

void start_reject(const std::shared_ptr<connector_obj>& o, std::vector<std::byte> pdata,
                  averbs::detail::completer<void> done) noexcept {
  if (auto ec = unusable(o)) return void(done.fail(ec));
  const std::error_code ec = locked(engine(*o), [&] {
    return o->c == nullptr ? err(errc::invalid_state) : o->m->reject(o->c, pdata);
  });
  if (ec) done.fail(ec);
  else done.complete({});
}

void start_disconnect(const std::shared_ptr<connector_obj>& o, averbs::detail::completer<void> done) noexcept {
  if (auto ec = unusable(o)) return void(done.fail(ec));
  const std::error_code ec = locked(engine(*o), [&] {
    return o->c == nullptr ? err(errc::not_connected) : o->m->disconnect(o->c);
  });
  if (ec) done.fail(ec);
  else done.complete({});
}

void start_notify_disconnect(const std::shared_ptr<connector_obj>& o, averbs::detail::completer<void> done) noexcept {
  if (auto ec = unusable(o)) return void(done.fail(ec));
  locked(engine(*o), [&] {
    if (o->c == nullptr) done.fail(err(errc::not_connected));
    else o->m->notify_disconnect(o->c, {&done.context(), done.id()});
    return 0;
  });
}

}  // namespace detail

namespace {
template <class T, class Fn>
T query(const std::shared_ptr<detail::connector_obj>& o, Fn&& fn) {
  if (o == nullptr) throw std::system_error(err(errc::invalid_argument), "empty averbs::cm::connector");
  std::lock_guard lock(o->dev->eng->lock());
  return fn(o->c);
}
}  // namespace

conn_state connector::state() const {
  // locked(), not query(): ending a cancelled handshake sends a REJ, which
  // the engine's next pass delivers.
  if (obj_ == nullptr) throw std::system_error(err(errc::invalid_argument), "empty averbs::cm::connector");
  return detail::locked(detail::engine(*obj_),
                        [&] { return obj_->c != nullptr ? obj_->m->state_of(obj_->c) : conn_state::idle; });
}
address connector::local_address() const {
  return query<address>(obj_, [](const detail::conn* c) { return c != nullptr ? c->local : address{}; });
}
address connector::peer_address() const {
  return query<address>(obj_, [](const detail::conn* c) { return c != nullptr ? c->peer : address{}; });
}
std::vector<std::byte> connector::private_data() const {
  return query<std::vector<std::byte>>(
      obj_, [](const detail::conn* c) { return c != nullptr ? c->pdata : std::vector<std::byte>{}; });
}
std::uint16_t connector::reject_reason() const {
  return query<std::uint16_t>(obj_, [](const detail::conn* c) { return c != nullptr ? c->rej_reason : 0; });
}
ah_attr connector::peer_ah() const {
  return query<ah_attr>(obj_, [](const detail::conn* c) {
    ah_attr a;
    if (c == nullptr) return a;
    a.is_global = true;
    a.port_num = 1;
    a.grh.dgid = c->peer_gid;
    a.grh.sgid_index = static_cast<std::uint8_t>(c->gid_index);
    a.grh.hop_limit = c->hop_limit;
    a.grh.traffic_class = c->traffic_class;
    return a;
  });
}

// ---------------------------------------------------------------------------
// Listener

namespace detail {

void listener_obj::close() noexcept {
  if (m == nullptr) return;
  soft::device& d = *dev->eng;
  {
    std::lock_guard lock(d.lock());
    if (l != nullptr) {
      m->close(l);
      l = nullptr;
      d.kick();
    }
  }
  d.drain_released();
}

context& context_of(const listener_obj* l) {
  if (l == nullptr) throw std::system_error(err(errc::invalid_argument), "empty averbs::cm::listener");
  return *l->dev->ctx;
}

address local_address_of(const listener_obj* l) {
  if (l == nullptr) throw std::system_error(err(errc::invalid_argument), "empty averbs::cm::listener");
  return l->at;
}

void start_listen(const device& dev, const address& at, int backlog, port_space ps,
                  averbs::detail::completer<listener> c) noexcept {
  const auto& dobj = averbs::detail::handle_access::obj(dev);
  if (dobj == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (dobj->removed()) return void(c.fail(err(errc::device_removed)));
  if (ps != port_space::tcp && ps != port_space::udp) return void(c.fail(err(errc::invalid_argument)));
  try {
    auto o = std::make_shared<listener_obj>();
    o->dev = dobj;
    o->m = &manager_of(*dobj->eng);
    const std::error_code ec = locked(*dobj->eng, [&] { return o->m->listen(at, ps, backlog, o->l); });
    if (ec) {
      o->m = nullptr;  // nothing to close
      return void(c.fail(ec));
    }
    o->at = o->l->at;
    c.complete({}, averbs::detail::handle_access::make<listener>(std::move(o)));
  } catch (...) {
    c.fail(err(errc::no_resources));
  }
}

void start_get_request(const std::shared_ptr<listener_obj>& l, averbs::detail::completer<connection_request> c) noexcept {
  if (l == nullptr) return void(c.fail(err(errc::invalid_argument)));
  if (l->dev->removed()) return void(c.fail(err(errc::device_removed)));
  std::shared_ptr<connector_obj> spare;
  try {
    spare = std::make_shared<connector_obj>();
    spare->dev = l->dev;
    spare->m = l->m;
  } catch (...) {
    return void(c.fail(err(errc::no_resources)));
  }
  locked(*l->dev->eng, [&] {
    if (l->l == nullptr) {
      c.fail(err(errc::stale_handle));  // closed
      l->dev->eng->release_later(std::move(spare));
    } else {
      l->m->get_request(l->l, {&c.context(), c.id()}, std::move(spare));
    }
    return 0;
  });
}

std::size_t cancel_get_requests(const std::shared_ptr<listener_obj>& l) noexcept {
  if (l == nullptr) return 0;
  return locked(*l->dev->eng, [&]() -> std::size_t { return l->l != nullptr ? l->m->cancel_gets(l->l) : 0; });
}

}  // namespace detail

void listener::close() noexcept {
  if (obj_ != nullptr) obj_->close();
}

listener listen(const device& dev, const address& at, int backlog, port_space ps) {
  return averbs::detail::sync_call<listener>([&](auto t) { return async_listen(dev, at, backlog, ps, t); },
                                             "averbs::cm::listen");
}
listener listen(const device& dev, const address& at, int backlog, port_space ps, std::error_code& ec) noexcept {
  return averbs::detail::sync_call<listener>([&](auto t) { return async_listen(dev, at, backlog, ps, t); }, ec);
}

}  // namespace averbs::cm
