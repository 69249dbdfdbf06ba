// SPDX-License-Identifier: MIT
#include "soft/links.hpp"

#include <atomic>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>

namespace averbs::soft {

bool parse_faults(const std::string& text, fault_config& out, std::string& error) {
  fault_config f;
  std::string_view rest = text;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      error = "expected key=value, got '" + std::string(item) + "'";
      return false;
    }
    const std::string key(item.substr(0, eq));
    const std::string value(item.substr(eq + 1));
    if (key == "seed" || key == "delay_us") {
      // Whole numbers: a seed as given; a delay up to a minute.
      std::uint64_t n = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || ec != std::errc{} || end != value.data() + value.size() ||
          (key == "delay_us" && n > 60'000'000)) {
        error = "bad value for " + key + ": '" + value + "' (" +
                (key == "seed" ? "a whole number" : "whole microseconds, at most 60000000") + ")";
        return false;
      }
      if (key == "seed")
        f.seed = n;
      else
        f.delay_time = std::chrono::microseconds(n);
      continue;
    }
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || !std::isfinite(v) || v < 0) {
      error = "bad value for " + key + ": '" + value + "'";
      return false;
    }
    if ((key == "drop" || key == "dup" || key == "duplicate" || key == "reorder" || key == "corrupt" ||
         key == "delay") &&
        v > 1) {
      error = key + " is a probability (0..1)";
      return false;
    }
    if (key == "drop") f.drop = v;
    else if (key == "dup" || key == "duplicate") f.duplicate = v;
    else if (key == "reorder") f.reorder = v;
    else if (key == "corrupt") f.corrupt = v;
    else if (key == "delay")
      f.delay = v;
    else {
      error = "unknown fault '" + key + "' (drop, dup, reorder, corrupt, delay, delay_us, seed)";
      return false;
    }
  }
  out = f;
  return true;
}

namespace {
std::atomic<std::uint64_t> next_serial{1};
}  // namespace

fault_link::fault_link(device& d, link& inner, const fault_config& cfg)
    : dev_(d),
      inner_(inner),
      cfg_(cfg),
      state_(cfg.seed * 0x9E3779B97F4A7C15ull + 1),
      serial_(next_serial.fetch_add(1, std::memory_order_relaxed)) {}

fault_link::~fault_link() {
  // What it still holds is lost, as on a wire that was cut.
  if (held_ != nullptr) {
    ++dev_.counters_.dropped;
    dev_.free_packet(held_);
  }
  for (auto& d : delayed_) {
    ++dev_.counters_.dropped;
    dev_.free_packet(d.p);
  }
}

void fault_link::schedule_release(clock::time_point due) noexcept {
  timer_pending_ = true;
  try {
    if (dev_.timers_.schedule(due,
                              [](void* arg, const detail::timer_payload& pl) noexcept {
                                // Only the link that scheduled it, if still in place.
                                auto* f = static_cast<fault_link*>(static_cast<device*>(arg)->faults_.get());
                                if (f != nullptr && f->serial_ == pl.a) f->release_delayed();
                              },
                              &dev_, {serial_, 0, {}}))
      dev_.rearm_timer_fd();
  } catch (...) {
    timer_pending_ = false;  // the next delayed packet tries again
  }
}

// splitmix64: small, seedable and reproducible across platforms.
double fault_link::uniform() noexcept {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

packet* fault_link::clone(const packet* p) noexcept {
  packet* c = dev_.alloc_packet();
  if (c == nullptr) return nullptr;
  std::byte* buf = c->buf;
  packet* next = c->next;
  *c = *p;
  c->buf = buf;
  c->next = next;
  std::uint32_t off = 0;
  for (std::uint8_t i = 0; i < p->nsegs; ++i) {
    std::memcpy(buf + off, p->segs[i].p, p->segs[i].len);
    off += p->segs[i].len;
  }
  c->segs[0] = {buf, off};
  c->nsegs = off == 0 ? 0 : 1;
  return c;
}

void fault_link::pass(packet* p, bool urgent) noexcept {
  if (cfg_.drop > 0 && uniform() < cfg_.drop) {
    ++dev_.counters_.dropped;
    dev_.free_packet(p);
    return;
  }
  if (cfg_.corrupt > 0 && uniform() < cfg_.corrupt) {
    // One bit, anywhere in the headers or the payload; never in the
    // application's memory: the payload is copied first.
    p->own_payload();
    const std::uint32_t span = p->header_len + p->payload_len;
    const auto bit = static_cast<std::uint32_t>(uniform() * span * 8);
    const std::uint32_t at = bit / 8;
    std::byte* where = at < p->header_len ? &p->header[at] : p->buf + (at - p->header_len);
    *where ^= std::byte(1u << (bit % 8));
  }
  if (cfg_.duplicate > 0 && uniform() < cfg_.duplicate) {
    if (packet* c = clone(p)) urgent ? inner_.send_urgent(c) : inner_.send(c);
  }
  if (cfg_.delay > 0 && uniform() < cfg_.delay) {
    p->own_payload();
    try {
      delayed_.push_back({dev_.clock().now() + cfg_.delay_time, p});
    } catch (...) {
      dev_.free_packet(p);
      return;
    }
    if (!timer_pending_) schedule_release(delayed_.back().due);
    return;
  }
  if (cfg_.reorder > 0 && held_ == nullptr && uniform() < cfg_.reorder) {
    p->own_payload();
    held_ = p;  // goes out behind the next packet
    return;
  }
  if (urgent) inner_.send_urgent(p);
  else inner_.send(p);
  if (held_ != nullptr) {
    inner_.send(std::exchange(held_, nullptr));
  }
}

void fault_link::release_delayed() noexcept {
  timer_pending_ = false;
  const auto now = dev_.clock().now();
  std::size_t kept = 0;
  for (auto& d : delayed_) {
    if (d.due <= now) inner_.send(d.p);
    else delayed_[kept++] = d;
  }
  delayed_.resize(kept);
  if (!delayed_.empty()) schedule_release(delayed_.front().due);
}

void fault_link::flush() noexcept {
  if (held_ != nullptr) inner_.send(std::exchange(held_, nullptr));
  inner_.flush();
}

}  // namespace averbs::soft
