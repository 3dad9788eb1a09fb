#include "backends/tensorpipe/tensorpipe_agent.h"

#include <tensorpipe/tensorpipe.h>

#include <memory>
#include <utility>

#include "backends/common/agent_skeleton.h"
#include "backends/tensorpipe/internal/agent_state.h"
#include "backends/tensorpipe/internal/settings.h"

namespace tether::backends {
namespace {

absl::StatusOr<std::unique_ptr<Agent>> create_agent(AgentSetup setup) {
  return common::create_agent<internal::AgentState>(
      internal::kTensorPipeNames, std::move(setup), internal::parse_settings);
}

}  // namespace

Backend tensorpipe_backend() {
  Backend backend;
  backend.name = internal::kTensorPipeNames.name;
  backend.viable = []() -> absl::Status {
    std::shared_ptr<::tensorpipe::transport::Context> uv =
        ::tensorpipe::transport::uv::create();
    const bool viable = uv->isViable();
    uv->close();
    uv->join();
    if (viable) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "tensorpipe's uv (TCP) transport is not viable on this machine");
  };
  backend.create = create_agent;
  return backend;
}

}  // namespace tether::backends
