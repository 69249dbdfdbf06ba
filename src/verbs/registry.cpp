// SPDX-License-Identifier: MIT
// The process's device registry: `embedded` (created on first use) and the
// devices soft_device objects register.
#include "verbs/objects.hpp"
#include "verbs/registry.hpp"

#include <averbs/error.hpp>
#include <averbs/verbs/soft_device.hpp>

#include <algorithm>
#include <map>

namespace averbs {
namespace detail {

namespace {

struct registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<device_entry>> devices;  // Must hold mu.
};

registry& reg() {
  static registry* r = new registry;  // never destroyed: handles may outlive static destruction
  return *r;
}

std::shared_ptr<device_entry> make_entry(const soft_device_options& o) {
  auto e = std::make_shared<device_entry>();
  e->name = o.name;
  soft::device_config cfg;
  cfg.name = o.name;
  cfg.clock = o.clock;
  cfg.gids = o.gids;
  e->engine = std::make_shared<soft::device>(cfg);
  return e;
}

}  // namespace

std::shared_ptr<device_entry> find_device(const std::string& name) {
  const std::string n = name.empty() ? std::string("embedded") : name;
  registry& r = reg();
  std::lock_guard lock(r.mu);
  auto it = r.devices.find(n);
  if (it != r.devices.end()) return it->second;
  if (n == "embedded") {
    auto e = make_entry({.name = "embedded"});
    r.devices.emplace(n, e);
    return e;
  }
  return nullptr;
}

std::shared_ptr<device_entry> register_device(const soft_device_options& o) {
  if (o.name.empty() || o.name == "embedded") throw std::system_error(make_error_code(errc::invalid_argument), "soft_device name");
  registry& r = reg();
  std::lock_guard lock(r.mu);
  if (r.devices.count(o.name) != 0) throw std::system_error(make_error_code(errc::already_exists), o.name);
  auto e = make_entry(o);
  r.devices.emplace(o.name, e);
  return e;
}

void unregister_device(const std::shared_ptr<device_entry>& e) {
  {
    registry& r = reg();
    std::lock_guard lock(r.mu);
    r.devices.erase(e->name);
  }
  e->removed.store(true, std::memory_order_release);
  e->engine->fatal();
}

std::vector<std::string> device_names() {
  registry& r = reg();
  std::lock_guard lock(r.mu);
  std::vector<std::string> v;
  bool have_embedded = false;
  for (auto& [name, e] : r.devices) {
    v.push_back(name);
    have_embedded = have_embedded || name == "embedded";
  }
  if (!have_embedded) v.insert(v.begin(), "embedded");
  std::sort(v.begin() + 1, v.end());
  return v;
}

}  // namespace detail

std::vector<std::string> list_devices() { return detail::device_names(); }

struct soft_device::impl {
  std::shared_ptr<detail::device_entry> entry;
};

soft_device::soft_device(const soft_device_options& opts)
    : impl_(std::make_unique<impl>(impl{detail::register_device(opts)})) {}

soft_device::~soft_device() { detail::unregister_device(impl_->entry); }

const std::string& soft_device::name() const noexcept { return impl_->entry->name; }

void soft_device::set_port_state(port_state s) { impl_->entry->engine->set_port_state(s); }

soft::device& soft_device::engine() const noexcept { return *impl_->entry->engine; }

}  // namespace averbs
