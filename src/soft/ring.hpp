// SPDX-License-Identifier: MIT
// Position-independent work and completion queues.
//
// A ring is one block of memory: a header with free-running producer and
// consumer indices, then a power-of-two array of fixed-size entries.  It
// holds no pointers, so it can later live in shared memory mapped at
// different addresses in the daemon and the application.  The producer
// writes an entry, then publishes it with a release store of `producer`; the
// consumer reads `producer` with acquire before reading entries, and
// releases entries with a release store of `consumer`.  One producer and one
// consumer at a time (callers serialise).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace averbs::soft {

struct alignas(64) ring_header {
  std::atomic<std::uint32_t> producer{0};
  std::uint32_t log2_size = 0;
  std::uint32_t entry_size = 0;
  alignas(64) std::atomic<std::uint32_t> consumer{0};
};

class ring {
 public:
  ring() = default;
  ring(const ring&) = delete;
  ring& operator=(const ring&) = delete;
  ~ring() { std::free(mem_); }
  friend void swap(ring& a, ring& b) noexcept {
    std::swap(a.mem_, b.mem_);
    std::swap(a.hdr_, b.hdr_);
  }

  /// Sizes the ring for at least `min_entries` entries of `entry_size`
  /// bytes (rounded up to 8).  Returns false if memory is short.
  bool init(std::uint32_t min_entries, std::size_t entry_size) {
    std::uint32_t log2 = 0;
    while ((1u << log2) < (min_entries == 0 ? 1 : min_entries)) ++log2;
    const std::size_t esz = (entry_size + 7) & ~std::size_t{7};
    const std::size_t bytes = sizeof(ring_header) + (std::size_t{1} << log2) * esz;
    void* m = std::aligned_alloc(64, (bytes + 63) & ~std::size_t{63});
    if (m == nullptr) return false;
    std::memset(m, 0, bytes);
    std::free(mem_);
    mem_ = m;
    hdr_ = ::new (m) ring_header;
    hdr_->log2_size = log2;
    hdr_->entry_size = static_cast<std::uint32_t>(esz);
    return true;
  }

  std::uint32_t size() const noexcept { return 1u << hdr_->log2_size; }
  std::uint32_t entry_size() const noexcept { return hdr_->entry_size; }
  std::uint32_t producer() const noexcept { return hdr_->producer.load(std::memory_order_acquire); }
  std::uint32_t consumer() const noexcept { return hdr_->consumer.load(std::memory_order_acquire); }
  std::uint32_t count() const noexcept { return producer() - consumer(); }
  bool empty() const noexcept { return count() == 0; }
  bool full() const noexcept { return count() >= size(); }

  /// The entry at free-running index `i`.
  void* at(std::uint32_t i) const noexcept {
    return reinterpret_cast<std::byte*>(hdr_ + 1) +
           static_cast<std::size_t>(i & (size() - 1)) * hdr_->entry_size;
  }
  template <class T>
  T* at(std::uint32_t i) const noexcept {
    return static_cast<T*>(at(i));
  }

  void publish(std::uint32_t new_producer) noexcept {
    hdr_->producer.store(new_producer, std::memory_order_release);
  }
  void release(std::uint32_t new_consumer) noexcept {
    hdr_->consumer.store(new_consumer, std::memory_order_release);
  }

  std::size_t bytes() const noexcept {
    return sizeof(ring_header) + static_cast<std::size_t>(size()) * hdr_->entry_size;
  }

 private:
  void* mem_ = nullptr;
  ring_header* hdr_ = nullptr;
};

}  // namespace averbs::soft
