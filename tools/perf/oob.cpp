// SPDX-License-Identifier: MIT
#include "perf/oob.hpp"

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace averbs::perf {

namespace {
[[noreturn]] void fail(const std::string& what) { throw std::system_error(errno, std::system_category(), what); }

// Network byte order both ways (its own inverse), on either host order.
std::uint64_t hton64(std::uint64_t v) { return htobe64(v); }
}  // namespace

oob::~oob() {
  if (fd_ >= 0) ::close(fd_);
}

oob& oob::operator=(oob&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    timeout_ = o.timeout_;
    o.fd_ = -1;
  }
  return *this;
}

oob oob::listen(const std::string& bind_addr, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(bind_addr.empty() ? nullptr : bind_addr.c_str(), service.c_str(), &hints, &res) != 0)
    throw std::runtime_error("bad listen address '" + bind_addr + "'");
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    fail("socket");
  }
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 1) != 0) {
    ::freeaddrinfo(res);
    ::close(fd);
    fail("bind/listen on port " + service);
  }
  ::freeaddrinfo(res);
  return oob(fd);
}

oob oob::accept(std::chrono::milliseconds timeout) const {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) throw std::runtime_error("no client connected");
  const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) fail("accept");
  const int one = 1;
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return oob(c);
}

namespace {

// One non-blocking attempt on one address, given at most `limit`; the
// socket (blocking again) on success, -1 with errno set otherwise.
int try_connect(const addrinfo& ai, std::chrono::milliseconds limit) {
  const int fd = ::socket(ai.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int e = 0;
  if (::connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
    e = errno;
    if (e == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int r =
          ::poll(&p, 1, static_cast<int>(std::max<std::chrono::milliseconds::rep>(limit.count(), 1)));
      socklen_t len = sizeof e;
      if (r != 1)
        e = ETIMEDOUT;
      else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
        e = errno;
    }
  }
  if (e != 0) {
    ::close(fd);
    errno = e;
    return -1;
  }
  // TCP lets a socket connect to itself when nothing listens at a local
  // address and the ephemeral port picked is the one asked for: the "peer"
  // would then be this process, agreeing with everything it says.  As if
  // refused: the caller tries again (the server may still be starting).
  sockaddr_storage self{}, peer{};
  socklen_t self_len = sizeof self, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 && self_len == peer_len &&
      std::memcmp(&self, &peer, self_len) == 0) {
    ::close(fd);
    errno = ECONNREFUSED;
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

oob oob::connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout) {
  using sc = std::chrono::steady_clock;
  const auto until = sc::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    throw std::runtime_error("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(res, &::freeaddrinfo);
  for (;;) {
    int e = ECONNREFUSED;
    // Every address in turn, each given no more than 3 s of what is left:
    // one that drops SYNs does not hold up the others.
    for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - sc::now());
      const int fd =
          try_connect(*ai, std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(3000)));
      if (fd >= 0) return oob(fd);
      e = errno;
    }
    if (sc::now() >= until) {
      errno = e;
      // The server listens on its device's address only.
      fail("connect to " + host + ":" + std::to_string(port) +
           (e == ECONNREFUSED ? " (nothing listens there: HOST must be the address of the server's device, "
                                "and the server serves one client, then ends)"
                              : ""));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the server is still starting
  }
}

std::uint16_t oob::bound_port() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

void oob::send_all(const void* p, std::size_t n) const {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t r = ::send(fd_, b, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("out-of-band send");
    b += r;
    n -= static_cast<std::size_t>(r);
  }
}

void oob::recv_all(void* p, std::size_t n) const {
  recv_all(p, n, std::chrono::steady_clock::now() + timeout_, 0, n);
}

void oob::recv_all(void* p, std::size_t n, std::chrono::steady_clock::time_point until,
                   std::size_t got_before, std::size_t of) const {
  using sc = std::chrono::steady_clock;
  auto* b = static_cast<char*>(p);
  const std::size_t want = n;
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - sc::now());
    pollfd pf{fd_, POLLIN, 0};
    const int pr = left.count() > 0 ? ::poll(&pf, 1, static_cast<int>(left.count())) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) fail("out-of-band poll");
    if (pr == 0) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.1f", static_cast<double>(timeout_.count()) / 1000);
      const std::size_t got = got_before + (want - n);
      if (got == 0)
        throw std::runtime_error(std::string("the peer sent nothing on the out-of-band connection for ") +
                                 secs + " s");
      throw std::runtime_error("the peer sent " + std::to_string(got) + " of the " + std::to_string(of) +
                               " bytes of a message on the out-of-band connection, then nothing until " +
                               secs + " s had passed");
    }
    const ssize_t r = ::recv(fd_, b, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r == 0) throw std::runtime_error("the peer closed the out-of-band connection");
    // A process that dies with our words unread resets the connection.
    if (r < 0 && (errno == ECONNRESET || errno == EPIPE))
      throw std::runtime_error("the peer closed the out-of-band connection (reset)");
    if (r < 0) fail("out-of-band recv");
    b += r;
    n -= static_cast<std::size_t>(r);
  }
}

void oob::send_info(const peer_info& i) const {
  unsigned char b[52];
  const std::uint32_t qpn = htonl(i.qpn), psn = htonl(i.psn), rkey = htonl(i.rkey);
  const std::uint64_t addr = hton64(i.addr), size = hton64(i.size);
  std::memcpy(b, &qpn, 4);
  std::memcpy(b + 4, &psn, 4);
  std::memcpy(b + 8, i.g.raw.data(), 16);
  std::memcpy(b + 24, &rkey, 4);
  std::memcpy(b + 28, &addr, 8);
  std::memcpy(b + 36, &size, 8);
  std::memset(b + 44, 0, 8);
  send_all(b, sizeof b);
}

peer_info oob::recv_info() const {
  unsigned char b[52];
  recv_all(b, sizeof b);
  peer_info i;
  std::uint32_t v;
  std::uint64_t w;
  std::memcpy(&v, b, 4);
  i.qpn = ntohl(v);
  std::memcpy(&v, b + 4, 4);
  i.psn = ntohl(v);
  std::memcpy(i.g.raw.data(), b + 8, 16);
  std::memcpy(&v, b + 24, 4);
  i.rkey = ntohl(v);
  std::memcpy(&w, b + 28, 8);
  i.addr = hton64(w);
  std::memcpy(&w, b + 36, 8);
  i.size = hton64(w);
  return i;
}

void oob::send_word(std::uint64_t w) const {
  const std::uint64_t n = hton64(w);
  send_all(&n, 8);
}

namespace {
// "AVBPERF" and a NUL; then the version of this exchange.
constexpr std::uint64_t params_magic = 0x4156425045524600ull;
// 2: a bandwidth client sends its figures to the server; 3: the RoCE port.
constexpr std::uint32_t params_version = 3;
constexpr std::size_t params_bytes = 52;
}  // namespace

void oob::send_params(const test_params& p) const {
  unsigned char b[params_bytes] = {};
  auto put32 = [&](std::size_t at, std::uint32_t v) {
    v = htonl(v);
    std::memcpy(b + at, &v, 4);
  };
  auto put64 = [&](std::size_t at, std::uint64_t v) {
    v = hton64(v);
    std::memcpy(b + at, &v, 8);
  };
  put64(0, params_magic);
  put32(8, params_version);
  put32(12, p.test);
  put32(16, p.mtu_bytes);
  put32(20, p.outs);
  put32(24, p.all_sizes);
  put64(28, p.size);
  put64(36, p.iters);
  put32(44, p.duration);
  put32(48, p.roce_port);
  send_all(b, sizeof b);
}

test_params oob::recv_params() const {
  // The magic and the version are checked as they come: a stranger that
  // sends a few bytes and waits for an answer is told apart at once, not
  // when the deadline (one for the whole greeting) has passed.
  unsigned char b[params_bytes];
  const auto until = std::chrono::steady_clock::now() + timeout_;
  recv_all(b, 8, until, 0, sizeof b);
  auto get32 = [&](std::size_t at) {
    std::uint32_t v;
    std::memcpy(&v, b + at, 4);
    return ntohl(v);
  };
  auto get64 = [&](std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, b + at, 8);
    return hton64(v);
  };
  if (get64(0) != params_magic)
    throw std::runtime_error("the peer on the out-of-band port is not averbs perf (no greeting)");
  recv_all(b + 8, 4, until, 8, sizeof b);
  if (get32(8) != params_version)
    throw std::runtime_error("the peer speaks version " + std::to_string(get32(8)) +
                             " of averbs perf's exchange, this is version " + std::to_string(params_version));
  recv_all(b + 12, sizeof b - 12, until, 12, sizeof b);
  test_params p;
  p.test = get32(12);
  p.mtu_bytes = get32(16);
  p.outs = get32(20);
  p.all_sizes = get32(24);
  p.size = get64(28);
  p.iters = get64(36);
  p.duration = get32(44);
  p.roce_port = get32(48);
  return p;
}

void oob::expect_word(std::uint64_t want, const char* what) const {
  const std::uint64_t got = recv_word();
  if (got != want)
    throw std::runtime_error(std::string("out-of-band exchange out of step at ") + what + ": expected " +
                             std::to_string(want) + ", the peer sent " + std::to_string(got));
}

bool oob::peer_closed() const {
  // POLLRDHUP reports the peer's FIN even with a message still unread.
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) != 1) return false;
  if ((p.revents & (POLLRDHUP | POLLERR | POLLHUP)) != 0) return true;
  char c;
  const ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

bool oob::readable() const {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

std::uint64_t oob::recv_word() const {
  std::uint64_t n;
  recv_all(&n, 8);
  return hton64(n);
}

}  // namespace averbs::perf
