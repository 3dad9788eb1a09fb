// BackendRegistry: the backends a Worker can be built on, by name.
//
// Explicit, not filled by static initialisers: `main` or a test makes one and
// calls register_builtin_backends() (backends/builtin.h) or add() for its own.
//
// Thread safety: add() before use; const methods from any thread after.
#ifndef TETHER_CORE_BACKEND_REGISTRY_H_
#define TETHER_CORE_BACKEND_REGISTRY_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/agent.h"

namespace tether {

struct Backend {
  std::string name;
  // OK when the backend can run here (library present, provider available);
  // otherwise a Status that says why not.
  std::function<absl::Status()> viable;
  AgentFactory create;
};

class BackendRegistry {
 public:
  // INVALID_ARGUMENT if a backend of that name is already registered.
  [[nodiscard]] absl::Status add(Backend backend);

  // NOT_FOUND naming the backend and listing the known ones.
  [[nodiscard]] absl::StatusOr<const Backend*> find(
      absl::string_view name) const;

  // Registered names, sorted.
  std::vector<std::string> names() const;

 private:
  absl::flat_hash_map<std::string, Backend> backends_;
};

}  // namespace tether

#endif  // TETHER_CORE_BACKEND_REGISTRY_H_
