#include "backends/tensorpipe/tensorpipe_agent.h"

#include <absl/strings/str_cat.h>

#include <memory>
#include <utility>

#include "backends/common/agent_skeleton.h"
#include "backends/tensorpipe/internal/agent_state.h"
#include "backends/tensorpipe/internal/settings.h"

namespace tether::backends {
namespace {

absl::StatusOr<std::unique_ptr<Agent>> create_agent(AgentSetup setup) {
  return common::create_agent<tensorpipe::internal::AgentState>(
      tensorpipe::internal::kTensorPipeNames, std::move(setup),
      tensorpipe::internal::parse_settings);
}

}  // namespace

Backend tensorpipe_backend() {
  Backend backend;
  backend.name = tensorpipe::internal::kTensorPipeNames.name;
  // The default transport, tether's tcp, needs a TCP socket that can
  // listen. (Asking TensorPipe's uv instead left libuv's process-wide pipe
  // pair open in every worker: 2 fds for a transport not used by default.)
  backend.viable = []() -> absl::Status {
    absl::Status usable = tensorpipe::internal::check_can_listen("tcp://127.0.0.1");
    if (usable.ok()) return usable;
    return absl::FailedPreconditionError(
        absl::StrCat("the tensorpipe backend's tcp transport is not viable on "
                     "this machine: ",
                     usable.message()));
  };
  backend.create = create_agent;
  return backend;
}

}  // namespace tether::backends
