// SPDX-License-Identifier: MIT
// How the engine reaches application memory.  The engine never dereferences
// an application address itself: it asks a memory_access for a host pointer
// (direct, or a shared mapping in the daemon) or, when none exists, copies
// through read()/write() (process_vm_readv/writev in the daemon).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace averbs::soft {

class memory_access {
 public:
  virtual ~memory_access() = default;
  /// A host pointer for [addr, addr + len), or null if the range cannot be
  /// mapped into this process (then read()/write() must be used).
  virtual std::byte* map(std::uint64_t addr, std::uint64_t len) noexcept = 0;
  virtual bool read(std::uint64_t addr, void* dst, std::size_t len) noexcept = 0;
  virtual bool write(std::uint64_t addr, const void* src, std::size_t len) noexcept = 0;
};

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
};

}  // namespace averbs::soft
