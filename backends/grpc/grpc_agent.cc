#include "backends/grpc/grpc_agent.h"

#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "backends/common/agent_skeleton.h"
#include "backends/grpc/internal/agent_state.h"
#include "backends/grpc/internal/settings.h"

namespace tether::backends {
namespace {

// ------------------------------------------------------------------- agent

// gRPC counts its users (channels, servers, credentials) and shuts itself
// down when the last one goes, possibly on one of its own threads through a
// detached cleanup thread; agents come and go (tests make hundreds), so
// each would cycle gRPC down and up, and the process may exit while such a
// cleanup runs. The backend holds gRPC up for the life of the process.
void keep_grpc_initialized() {
  static const bool initialized = [] {
    grpc_init();
    return true;
  }();
  (void)initialized;
}

absl::StatusOr<std::unique_ptr<Agent>> create_agent(AgentSetup setup) {
  keep_grpc_initialized();
  return common::create_agent<grpc::internal::AgentState>(
      grpc::internal::kGrpcNames, std::move(setup),
      grpc::internal::parse_settings);
}

// OK if this process can open a TCP listener on loopback, which every
// gRPC agent needs (its server listens, its channels connect).
absl::Status check_viable() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the grpc backend (gRPC ", ::grpc::Version(),
                     ") cannot open a TCP socket: ", std::strerror(errno)));
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  if (rc == 0) rc = ::listen(fd, 1);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the grpc backend (gRPC ", ::grpc::Version(),
                     ") cannot listen on 127.0.0.1: ", std::strerror(saved)));
  }
  return absl::OkStatus();
}

}  // namespace

Backend grpc_backend() {
  Backend backend;
  backend.name = grpc::internal::kGrpcNames.name;
  backend.viable = check_viable;
  backend.create = create_agent;
  return backend;
}

}  // namespace tether::backends
