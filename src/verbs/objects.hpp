// SPDX-License-Identifier: MIT
// The user side of every verbs object: what a public handle points to.  Each
// holds its engine object and a reference on its parent, so children always
// go before their parents, and on the device entry, whose `removed` flag
// makes every later call fail cleanly after device removal.
#pragma once

#include "soft/engine.hpp"

#include <pthread.h>

#include <averbs/async/request_group.hpp>
#include <averbs/verbs/types.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

namespace averbs::detail {

/// A shared lock that prefers writers (glibc's rwlock with
/// PREFER_WRITER_NONRECURSIVE): a destroy waits only for the control
/// verbs already running, not for a stream of new ones (std::shared_mutex
/// prefers readers, so threads calling qp::state() in a loop could hold a
/// destroy off for ever).  Not recursive: a thread never takes it twice.
class handle_lock {
 public:
  handle_lock() noexcept {
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&rw_, &a);
    pthread_rwlockattr_destroy(&a);
  }
  ~handle_lock() { pthread_rwlock_destroy(&rw_); }
  handle_lock(const handle_lock&) = delete;
  handle_lock& operator=(const handle_lock&) = delete;
  void lock() noexcept { pthread_rwlock_wrlock(&rw_); }
  void unlock() noexcept { pthread_rwlock_unlock(&rw_); }
  void lock_shared() noexcept { pthread_rwlock_rdlock(&rw_); }
  void unlock_shared() noexcept { pthread_rwlock_unlock(&rw_); }

 private:
  pthread_rwlock_t rw_;
};

/// A registered device: the engine and whether it is still present.
struct device_entry {
  std::string name;
  std::shared_ptr<soft::device> engine;
  std::atomic<bool> removed{false};
  std::mutex mu;
  std::map<context_impl*, int> sources;  // contexts the engine drives; Must hold mu.
  /// Held shared by a control verb while it uses a handle's engine object,
  /// exclusively by a destroy while it empties the handle (use_handles(),
  /// live()).
  handle_lock handles;
};

struct device_obj {
  context* ctx = nullptr;
  std::shared_ptr<device_entry> entry;
  soft::device* eng = nullptr;
  soft::event_channel* channel = nullptr;  // this handle's async events
  std::unique_ptr<request_group> events;
  ~device_obj();
  bool removed() const noexcept { return entry->removed.load(std::memory_order_acquire); }
};

struct pd_obj {
  std::shared_ptr<device_obj> dev;
  soft::pd_t* e = nullptr;  // null once deallocated
  ~pd_obj();
};

struct mr_obj {
  std::shared_ptr<device_obj> dev;  // fixed; `pd` changes with rereg (under the exclusive handle lock)
  std::shared_ptr<pd_obj> pd;
  soft::mr_t* e = nullptr;
  void* addr = nullptr;
  std::size_t length = 0;
  ~mr_obj();
};

struct mw_obj {
  std::shared_ptr<pd_obj> pd;
  soft::mw_t* e = nullptr;
  soft::object_ref ref;  // what a work request naming it finds it by
  ~mw_obj();
};

struct ah_obj {
  std::shared_ptr<pd_obj> pd;
  soft::ah_t* e = nullptr;
  soft::object_ref ref;  // what a work request naming it finds it by
  ah_attr attr{};
  ~ah_obj();
};

struct cq_obj {
  std::shared_ptr<device_obj> dev;
  soft::cq_t* e = nullptr;
  std::unique_ptr<request_group> notifies;
  ~cq_obj();
};

struct srq_obj {
  std::shared_ptr<pd_obj> pd;
  soft::srq_t* e = nullptr;
  ~srq_obj();
};

struct qp_obj {
  std::shared_ptr<pd_obj> pd;
  std::shared_ptr<cq_obj> scq, rcq;
  std::shared_ptr<srq_obj> srq;
  soft::qp_t* e = nullptr;
  std::uint32_t qpn = 0;
  qp_type type = qp_type::rc;
  ~qp_obj();
};

inline soft::device& engine_of(const device_obj& d) { return *d.eng; }

/// A control verb (modify, query, create with a parent, connect ...) holds
/// this while it uses the engine objects of handles, which it reads with
/// live().  A destroy empties the handle's slot under the exclusive lock
/// and frees the object after: so a destroy on another thread comes wholly
/// before the verb (which finds the slot empty: stale_handle) or after it,
/// never while the verb dereferences the object.  The data path does not
/// take it: destroying a QP or CQ another thread posts to or polls is the
/// caller's race, as in libibverbs.
inline std::shared_lock<handle_lock> use_handles(const device_obj& d) {
  return std::shared_lock<handle_lock>(d.entry->handles);
}

/// The engine object in a handle's slot (null once destroyed).
template <class E>
E* live(E* const& slot) noexcept {
  return std::atomic_ref<E*>(const_cast<E*&>(slot)).load(std::memory_order_acquire);
}

}  // namespace averbs::detail
