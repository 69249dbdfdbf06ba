// SPDX-License-Identifier: MIT
// The user side of every verbs object: what a public handle points to.  Each
// holds its engine object and a reference on its parent, so children always
// go before their parents, and on the device entry, whose `removed` flag
// makes every later call fail cleanly after device removal.
#pragma once

#include "soft/engine.hpp"

#include <averbs/async/request_group.hpp>
#include <averbs/verbs/types.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace averbs::detail {

/// A registered device: the engine and whether it is still present.
struct device_entry {
  std::string name;
  std::shared_ptr<soft::device> engine;
  std::atomic<bool> removed{false};
  std::mutex mu;
  std::map<context_impl*, int> sources;  // contexts the engine drives; Must hold mu.
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
  std::shared_ptr<pd_obj> pd;
  soft::mr_t* e = nullptr;
  void* addr = nullptr;
  std::size_t length = 0;
  ~mr_obj();
};

struct mw_obj {
  std::shared_ptr<pd_obj> pd;
  soft::mw_t* e = nullptr;
  ~mw_obj();
};

struct ah_obj {
  std::shared_ptr<pd_obj> pd;
  soft::ah_t* e = nullptr;
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

}  // namespace averbs::detail
