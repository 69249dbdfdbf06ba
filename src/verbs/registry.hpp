// SPDX-License-Identifier: MIT
#pragma once

#include "verbs/objects.hpp"

#include <averbs/verbs/soft_device.hpp>

#include <memory>
#include <string>
#include <vector>

namespace averbs::detail {

/// The entry for a device name ("" means embedded), or null.
std::shared_ptr<device_entry> find_device(const std::string& name);
std::shared_ptr<device_entry> register_device(const soft_device_options& o);
void unregister_device(const std::shared_ptr<device_entry>& e);

/// A device this process knows by name.  `entry` is null for one the
/// environment or the configuration file names but nobody has opened yet
/// (listing or resolving does not create it: creating binds its address
/// and port, which another process may own); `address` is then its
/// configured address, or zero when its entry is broken.
struct known_device {
  std::string name;
  std::shared_ptr<device_entry> entry;
  gid address{};
};
/// "embedded" first, then the others by name.
std::vector<known_device> known_devices();
std::vector<std::string> device_names();

}  // namespace averbs::detail
