// SPDX-License-Identifier: MIT
#include "soft/memory.hpp"

#include <averbs/error.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace averbs::soft {

namespace {

// Whether every page of [addr, end) is mapped (mincore() fails with ENOMEM
// on a hole): the check where /proc/self/maps cannot be read.
bool all_mapped(std::uint64_t addr, std::uint64_t end) noexcept {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  unsigned char vec[256];
  for (std::uint64_t p = addr & ~(page - 1); p < end;) {
    const std::uint64_t n = std::min<std::uint64_t>((end - p + page - 1) / page, sizeof vec);
    if (::mincore(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)), n * page, vec) != 0 && errno == ENOMEM)
      return false;
    p += n * page;
  }
  return true;
}

// The PROCMAP_QUERY ioctl on /proc/self/maps (Linux 6.11): the mapping
// covering an address and its protections, in one call.  Debian 12's
// headers predate it, so its ABI (include/uapi/linux/fs.h) is spelled here.
struct procmap_query {
  std::uint64_t size;
  std::uint64_t query_flags;
  std::uint64_t query_addr;
  std::uint64_t vma_start;
  std::uint64_t vma_end;
  std::uint64_t vma_flags;
  std::uint64_t vma_page_size;
  std::uint64_t vma_offset;
  std::uint64_t inode;
  std::uint32_t dev_major;
  std::uint32_t dev_minor;
  std::uint32_t vma_name_size;
  std::uint32_t build_id_size;
  std::uint64_t vma_name_addr;
  std::uint64_t build_id_addr;
};
static_assert(sizeof(procmap_query) == 104);
constexpr unsigned long procmap_query_ioctl = 0xC0686611;  // _IOWR('f', 17, struct procmap_query)
constexpr std::uint64_t vma_readable = 0x01, vma_writable = 0x02;

enum class answer { yes, no, unknown };

// The check by PROCMAP_QUERY, `unknown` where the kernel lacks it.
answer query_mappings(int fd, std::uint64_t addr, std::uint64_t end, bool writable) noexcept {
  for (std::uint64_t at = addr; at < end;) {
    procmap_query q{};
    q.size = sizeof q;
    q.query_addr = at;  // no flags: the mapping covering `at`, or ENOENT
    if (::ioctl(fd, procmap_query_ioctl, &q) != 0) {
      if (errno == ENOENT) return answer::no;  // a hole
      return answer::unknown;
    }
    if ((q.vma_flags & vma_readable) == 0 || (writable && (q.vma_flags & vma_writable) == 0)) return answer::no;
    at = q.vma_end;
  }
  return answer::yes;
}

}  // namespace

// No system call answers "is this range mapped with these protections";
// /proc/self/maps does: by PROCMAP_QUERY where the kernel has it (a few
// microseconds), else by its text, one line per mapping in address order
// (tens of microseconds).  The mappings may change right after: so they may
// after ib_umem_get() too, which at least keeps the pages pinned.
bool maps_text_covers(std::FILE* maps, std::uint64_t addr, std::uint64_t end, bool writable) noexcept {
  char* line = nullptr;
  std::size_t cap = 0;
  std::uint64_t covered = addr;  // [addr, covered) is mapped as asked
  while (covered < end && ::getline(&line, &cap, maps) > 0) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (hi <= covered) continue;
    if (lo > covered) break;  // a hole
    if (perms[0] != 'r' || (writable && perms[1] != 'w')) break;
    covered = hi;
  }
  std::free(line);
  return covered >= end;
}

std::error_code direct_memory::check(std::uint64_t addr, std::uint64_t len, bool writable) noexcept {
  const std::uint64_t end = addr + len;
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  bool ok;
  if (fd < 0) {
    ok = all_mapped(addr, end);
  } else if (const answer a = query_mappings(fd, addr, end, writable); a != answer::unknown) {
    ok = a == answer::yes;
    ::close(fd);
  } else if (std::FILE* f = ::fdopen(fd, "r"); f != nullptr) {
    ok = maps_text_covers(f, addr, end, writable);
    std::fclose(f);
  } else {
    ::close(fd);
    ok = all_mapped(addr, end);
  }
  return ok ? std::error_code{} : make_error_code(errc::bad_address);
}

}  // namespace averbs::soft
