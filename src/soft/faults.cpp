// SPDX-License-Identifier: MIT
#include "soft/links.hpp"
#include "soft/splitmix.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>

namespace averbs::soft {

bool parse_faults(const std::string& text, fault_config& out, std::string& error) {
  fault_config f;
  std::string_view rest = text;
  std::vector<std::string> seen;  // keys given, by canonical name: each once
  for (bool more = !rest.empty(); more;) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    more = comma != std::string_view::npos;
    rest = more ? rest.substr(comma + 1) : std::string_view{};
    if (item.empty() && !more && !seen.empty()) break;  // one trailing comma
    if (item.empty()) {
      error = "empty item in '" + text + "' (items are key=value, separated by single commas)";
      return false;
    }
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      error = "expected key=value, got '" + std::string(item) + "'";
      return false;
    }
    const std::string key(item.substr(0, eq));
    const std::string value(item.substr(eq + 1));
    const std::string canonical = key == "duplicate" ? "dup" : key;
    if (std::find(seen.begin(), seen.end(), canonical) != seen.end()) {
      error = "'" + canonical + "' is given twice";
      return false;
    }
    seen.push_back(canonical);
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
    double* rate = key == "drop"                        ? &f.drop
                   : key == "dup" || key == "duplicate" ? &f.duplicate
                   : key == "reorder"                   ? &f.reorder
                   : key == "corrupt"                   ? &f.corrupt
                   : key == "delay"                     ? &f.delay
                                                        : nullptr;
    if (rate == nullptr) {
      error = "unknown fault '" + key + "' (drop, dup, reorder, corrupt, delay, delay_us, seed)";
      return false;
    }
    // from_chars, not strtod: the decimal point is '.' whatever the
    // program's locale, and no sign or space is taken.
    double v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (value.empty() || ec != std::errc{} || end != value.data() + value.size() || !std::isfinite(v) ||
        v < 0) {
      error = "bad value for " + key + ": '" + value + "' (a probability, 0..1)";
      return false;
    }
    if (v > 1) {
      error = key + " is a probability (0..1)";
      return false;
    }
    *rate = v;
  }
  // (Checked after the loop: the items may come in any order.)
  const auto given = [&](const char* k) { return std::find(seen.begin(), seen.end(), k) != seen.end(); };
  if (given("delay_us") && !given("delay") && !given("reorder")) {
    error = "delay_us without delay or reorder has no effect";
    return false;
  }
  out = f;
  return true;
}

namespace {
std::atomic<std::uint64_t> next_serial{1};

// The generator's start: the seed and the device's node GUID, each mixed,
// so that seeds s and s + 1 give unrelated streams (a linear start made
// seed s + 1 the stream of seed s one draw on) and two devices given one
// specification do not lose the same packets of their streams.
std::uint64_t initial_state(std::uint64_t seed, std::uint64_t guid) noexcept {
  return mix64(mix64(seed ^ 0x6A09E667F3BCC909ull) ^ guid);
}
}  // namespace

fault_link::fault_link(device& d, link& inner, const fault_config& cfg)
    : dev_(d),
      inner_(inner),
      cfg_(cfg),
      state_(initial_state(cfg.seed, d.node_guid())),
      serial_(next_serial.fetch_add(1, std::memory_order_relaxed)) {}

fault_link::~fault_link() {
  // What is held or delayed goes on at once (set_faults() replacing the
  // faults loses nothing), unless the port is down (a device removed or
  // a cable pulled sends nothing).
  if (held_ != nullptr) release(std::exchange(held_, nullptr), held_urgent_);
  for (auto& d : delayed_) release(d.p, d.urgent);
  inner_.flush();
}

void fault_link::release(packet* p, bool urgent) noexcept {
  if (!dev_.port_carries(p)) return;
  urgent ? inner_.send_urgent(p) : inner_.send(p);
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

double fault_link::uniform() noexcept { return static_cast<double>(splitmix_next(state_) >> 11) * 0x1.0p-53; }

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
    ++dev_.counters_.faults_dropped;
    dev_.free_packet(p);
    return;
  }
  if (cfg_.corrupt > 0 && uniform() < cfg_.corrupt) {
    // One bit, anywhere in the headers or the payload but BTH byte 4
    // (FECN, BECN and reserved bits, which the ICRC leaves out: a flip
    // there would go unseen); never in the application's memory: the
    // payload is copied first.
    p->own_payload();
    const std::uint32_t span = p->header_len + p->payload_len - 1;
    const auto bit = static_cast<std::uint32_t>(uniform() * span * 8);
    const std::uint32_t at = bit / 8 < 4 ? bit / 8 : bit / 8 + 1;
    std::byte* where = at < p->header_len ? &p->header[at] : p->buf + (at - p->header_len);
    *where ^= std::byte(1u << (bit % 8));
    ++dev_.counters_.faults_corrupted;
  }
  if (cfg_.duplicate > 0 && uniform() < cfg_.duplicate) {
    if (packet* c = clone(p)) {
      ++dev_.counters_.faults_duplicated;
      urgent ? inner_.send_urgent(c) : inner_.send(c);
    }
  }
  if (cfg_.delay > 0 && uniform() < cfg_.delay) {
    p->own_payload();
    hold(p, deadline_after(dev_.clock().now(), cfg_.delay_time), urgent);
    return;
  }
  // Drawn whether or not a packet is held already: whether the timer let
  // the last one go yet depends on the wall clock, and a draw skipped for
  // it would shift every later draw, so a seed would not repeat its run.
  const bool reorder = cfg_.reorder > 0 && uniform() < cfg_.reorder;
  if (reorder && held_ == nullptr) {
    p->own_payload();
    ++dev_.counters_.faults_reordered;
    held_ = p;  // goes out behind the next packet
    held_urgent_ = urgent;
    // A MAD leaves outside a pass (send_urgent: a connect, a reply to
    // one), and no flush() may follow it until the CM's retry timer: its
    // delay time starts now.
    if (urgent) start_held_wait();
    return;
  }
  if (urgent) inner_.send_urgent(p);
  else inner_.send(p);
  if (held_ != nullptr) {
    held_waits_ = false;
    // Behind `p`: ahead of the batch only if `p` went ahead of it too.
    release(std::exchange(held_, nullptr), held_urgent_ && urgent);
  }
}

// A packet held for reordering that nothing passed in its own pass (a lone
// request, ACK or MAD) stays held for the next pass, up to the delay time,
// then leaves (release_delayed).
void fault_link::flush() noexcept {
  if (held_ != nullptr && !held_waits_) start_held_wait();
  inner_.flush();
}

void fault_link::start_held_wait() noexcept {
  held_waits_ = true;
  held_due_ = deadline_after(dev_.clock().now(), cfg_.delay_time);
  if (!timer_pending_) schedule_release(held_due_);
}

void fault_link::drop_queued() noexcept {
  held_waits_ = false;
  if (held_ != nullptr) {
    ++dev_.counters_.dropped;
    dev_.free_packet(std::exchange(held_, nullptr));
  }
  for (auto& d : delayed_) {
    ++dev_.counters_.dropped;
    dev_.free_packet(d.p);
  }
  delayed_.clear();
  inner_.drop_queued();
}

// Keeps `p` (its payload its own) until `due`; lost if there is no room.
void fault_link::hold(packet* p, clock::time_point due, bool urgent) noexcept {
  if (delayed_.size() >= max_delayed) {
    ++dev_.counters_.dropped;
    dev_.free_packet(p);
    return;
  }
  try {
    delayed_.push_back({due, p, urgent});
  } catch (...) {
    ++dev_.counters_.dropped;
    dev_.free_packet(p);
    return;
  }
  ++dev_.counters_.faults_delayed;  // (only one kept: one lost above is a drop)
  if (!timer_pending_) schedule_release(due);
}

void fault_link::release_delayed() noexcept {
  timer_pending_ = false;
  const auto now = dev_.clock().now();
  std::size_t kept = 0;
  for (auto& d : delayed_) {
    if (d.due <= now)
      release(d.p, d.urgent);
    else delayed_[kept++] = d;
  }
  delayed_.resize(kept);
  if (held_ != nullptr && held_waits_ && held_due_ <= now) {
    held_waits_ = false;
    release(std::exchange(held_, nullptr), held_urgent_);
  }
  // The delayed fall due in the order they came (one delay time each).
  const bool waits = held_ != nullptr && held_waits_;
  if (!delayed_.empty())
    schedule_release(waits ? std::min(held_due_, delayed_.front().due) : delayed_.front().due);
  else if (waits)
    schedule_release(held_due_);
}

}  // namespace averbs::soft
