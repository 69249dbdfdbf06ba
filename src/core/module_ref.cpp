// SPDX-License-Identifier: MIT
// Client reference counting (the seed's IbOpenAl(DEVICE_OBJECT*)): a request
// whose handler code lives in a dlopen()ed module holds a reference on that
// module until the handler has run or been destroyed, so the host may
// dlclose() the module with operations pending.
//
// The module is found from the address of the handler's type-erased thunk,
// which the compiler instantiates in the module that started the operation.
// Handlers in the main program or in libaverbs itself (the common case) are
// recognised by an address-range check and cost nothing more.
#include "core/context_impl.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstdint>

namespace averbs::detail {

namespace {

struct range {
  std::uintptr_t lo = 0, hi = 0;
  bool contains(std::uintptr_t a) const noexcept { return a >= lo && a < hi; }
};

struct fixed_ranges {
  range main_program;
  range self;
};

range object_range(const dl_phdr_info* info) {
  range r{UINTPTR_MAX, 0};
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    const std::uintptr_t hi = lo + ph.p_memsz;
    if (lo < r.lo) r.lo = lo;
    if (hi > r.hi) r.hi = hi;
  }
  return r;
}

fixed_ranges compute_ranges() {
  fixed_ranges f;
  struct ctx_t {
    fixed_ranges* f;
    std::uintptr_t self_addr;
    bool first = true;
  } state{&f, reinterpret_cast<std::uintptr_t>(&compute_ranges)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) -> int {
        auto* st = static_cast<ctx_t*>(p);
        const range r = object_range(info);
        if (st->first) {
          st->f->main_program = r;
          st->first = false;
        }
        if (r.contains(st->self_addr)) st->f->self = r;
        return 0;
      },
      &state);
  return f;
}

const fixed_ranges& ranges() {
  static const fixed_ranges r = compute_ranges();
  return r;
}

}  // namespace

void* module_acquire(const void* code) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(code);
  const fixed_ranges& r = ranges();
  if (r.main_program.contains(a) || r.self.contains(a)) return nullptr;
  Dl_info info{};
  if (::dladdr(code, &info) == 0 || info.dli_fname == nullptr || info.dli_fname[0] == '\0')
    return nullptr;
  // RTLD_NOLOAD: only take a reference on the already-loaded object.
  return ::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
}

void module_release(void* handle) noexcept { ::dlclose(handle); }

}  // namespace averbs::detail
