// SPDX-License-Identifier: MIT
// How the engine reaches application memory.  The engine never dereferences
// an application address itself: it asks a memory_access for a host pointer
// (direct, or a shared mapping in the daemon) or, when none exists, copies
// through read()/write() (process_vm_readv/writev in the daemon).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace averbs::soft {

class memory_access {
 public:
  virtual ~memory_access() = default;
  /// A host pointer for [addr, addr + len), or null if the range cannot be
  /// mapped into this process (then read()/write() must be used).
  virtual std::byte* map(std::uint64_t addr, std::uint64_t len) noexcept = 0;
  virtual bool read(std::uint64_t addr, void* dst, std::size_t len) noexcept = 0;
  virtual bool write(std::uint64_t addr, const void* src, std::size_t len) noexcept = 0;
  /// Whether [addr, addr + len) is mapped readable, and writable if
  /// `writable`, as registration needs it: the kernel's ib_umem_get() pins
  /// the pages and fails with EFAULT otherwise (`errc::bad_address`).
  virtual std::error_code check(std::uint64_t addr, std::uint64_t len, bool writable) noexcept = 0;
};

/// Whether the mappings listed in `maps` (the text of /proc/PID/maps, in
/// address order) cover [addr, end) readable, and writable if `writable`:
/// direct_memory::check() where the kernel has no PROCMAP_QUERY.
bool maps_text_covers(std::FILE* maps, std::uint64_t addr, std::uint64_t end, bool writable) noexcept;

/// The application shares the engine's address space (the embedded device).
class direct_memory final : public memory_access {
 public:
  std::byte* map(std::uint64_t addr, std::uint64_t) noexcept override {
    return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(addr));
  }
  bool read(std::uint64_t addr, void* dst, std::size_t len) noexcept override {
    std::memcpy(dst, map(addr, len), len);
    return true;
  }
  bool write(std::uint64_t addr, const void* src, std::size_t len) noexcept override {
    std::memcpy(map(addr, len), src, len);
    return true;
  }
  std::error_code check(std::uint64_t addr, std::uint64_t len, bool writable) noexcept override;
};

}  // namespace averbs::soft
