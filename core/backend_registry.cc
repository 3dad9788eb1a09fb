#include "core/backend_registry.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>

namespace tether {

absl::Status BackendRegistry::add(Backend backend) {
  if (backend.name.empty() || !backend.create || !backend.viable) {
    return absl::InvalidArgumentError(
        "backend registration needs a name, a factory and a viability check");
  }
  std::string name = backend.name;
  if (!backends_.emplace(name, std::move(backend)).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const Backend*> BackendRegistry::find(
    absl::string_view name) const {
  auto it = backends_.find(name);
  if (it == backends_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown backend '", name,
                                            "'; known backends: ",
                                            absl::StrJoin(names(), ", ")));
  }
  return &it->second;
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> names;
  for (const auto& [name, backend] : backends_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tether
