#include "backends/libfabric/libfabric_agent.h"

#include <memory>
#include <string>
#include <utility>

#include "backends/common/agent_support.h"
#include "backends/libfabric/internal/agent_state.h"
#include "backends/libfabric/internal/fabric.h"
#include "backends/libfabric/internal/settings.h"

namespace tether::backends {
namespace {

using libfabric::internal::kLibfabricNames;
using libfabric::internal::Settings;
using libfabric::internal::AgentState;

using LibfabricAgent = common::SharedStateAgent<AgentState>;

}  // namespace

Backend libfabric_backend(
    absl::flat_hash_map<std::string, std::string> defaults) {
  Backend backend;
  backend.name = kLibfabricNames.name;
  backend.viable = [defaults]() -> absl::Status {
    absl::StatusOr<Settings> settings =
        libfabric::internal::parse_settings(defaults);
    if (!settings.ok()) return settings.status();
    return libfabric::internal::probe(settings->provider);
  };
  backend.create = [defaults](AgentSetup setup) {
    for (const auto& [key, value] : defaults) {
      setup.settings.try_emplace(key, value);
    }
    return common::create_agent<AgentState>(kLibfabricNames, std::move(setup),
                                       libfabric::internal::parse_settings);
  };
  return backend;
}

absl::StatusOr<LibfabricStats> libfabric_stats(Agent& agent) {
  auto* libfabric = dynamic_cast<LibfabricAgent*>(&agent);
  if (libfabric == nullptr) {
    return absl::InvalidArgumentError("not an agent of the libfabric backend");
  }
  return libfabric->state().stats();
}

}  // namespace tether::backends
