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
std::vector<std::string> device_names();

}  // namespace averbs::detail
