// SPDX-License-Identifier: MIT
#include "perf/oob.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace averbs::perf {

namespace {
[[noreturn]] void fail(const std::string& what) { throw std::system_error(errno, std::system_category(), what); }

std::uint64_t hton64(std::uint64_t v) { return (std::uint64_t{htonl(static_cast<std::uint32_t>(v))} << 32) | htonl(static_cast<std::uint32_t>(v >> 32)); }
}  // namespace

oob::~oob() {
  if (fd_ >= 0) ::close(fd_);
}

oob& oob::operator=(oob&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
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

oob oob::connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0)
      throw std::runtime_error("cannot resolve '" + host + "'");
    const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      ::freeaddrinfo(res);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return oob(fd);
    }
    const int e = errno;
    if (fd >= 0) ::close(fd);
    ::freeaddrinfo(res);
    if (std::chrono::steady_clock::now() >= until) {
      errno = e;
      fail("connect to " + host + ":" + std::to_string(port));
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
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd_, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error("peer closed the out-of-band connection");
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
