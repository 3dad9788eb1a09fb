// One worker of testing/hosts/links_test.sh, on a simulated host
// (testing/hosts/hosts.sh). It joins the group with the backend's default
// address (no address setting: core/host_address.h chooses), calls every
// other worker with a 1 MiB tensor and checks the answer, prints how its
// agent reaches each peer (Agent::link_to), one line per peer:
//
//   link w0 -> w1: transport tcp, channel cma_write
//
// and shuts down gracefully. Environment: RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT (as a launcher sets them), TETHER_TEST_BACKEND (tensorpipe by
// default). Exits non-zero if a call or the shutdown fails.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/builtin.h"
#include "core/rpc.h"
#include "core/worker.h"

int main() {
  const char* rank_text = std::getenv("RANK");
  const char* world_text = std::getenv("WORLD_SIZE");
  const char* backend = std::getenv("TETHER_TEST_BACKEND");
  if (rank_text == nullptr || world_text == nullptr) {
    std::fprintf(stderr, "hosts_worker: RANK and WORLD_SIZE must be set\n");
    return 2;
  }
  const int rank = std::atoi(rank_text);
  const int world = std::atoi(world_text);
  tether::BackendRegistry registry;
  if (!tether::backends::register_builtin_backends(registry).ok()) return 1;
  tether::RpcOptions options;
  options.backend = backend != nullptr ? backend : "tensorpipe";
  options.default_timeout = absl::Seconds(30);
  const std::string me = absl::StrCat("w", rank);
  if (absl::Status up = tether::init_rpc(me, rank, world, options, registry);
      !up.ok()) {
    std::printf("FAILED: %s: init: %s\n", me.c_str(), up.ToString().c_str());
    return 1;
  }
  bool good = true;
  const at::Tensor big = at::ones({1 << 18});  // 1 MiB of floats
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    const std::string to = absl::StrCat("w", peer);
    absl::StatusOr<at::Tensor> sum =
        tether::rpc_sync<at::Tensor>(to, "aten::add.Tensor", {big, big});
    const bool right = sum.ok() && sum->sum().item<double>() == 2.0 * (1 << 18);
    std::printf("%s: call %s -> %s\n", right ? "ok" : "FAILED", me.c_str(),
                sum.ok() ? to.c_str()
                         : absl::StrCat(to, ": ", sum.status().ToString()).c_str());
    good = good && right;
    absl::StatusOr<tether::PeerLink> link =
        tether::current_worker()->link_to(tether::WorkerInfo{to, peer});
    if (link.ok()) {
      std::printf("link %s -> %s: transport %s, channel %s\n", me.c_str(),
                  to.c_str(), link->transport.c_str(), link->channel.c_str());
    } else {
      std::printf("link %s -> %s: %s\n", me.c_str(), to.c_str(),
                  link.status().ToString().c_str());
    }
  }
  std::fflush(stdout);
  if (absl::Status down = tether::shutdown(); !down.ok()) {
    std::printf("FAILED: %s: shutdown: %s\n", me.c_str(),
                down.ToString().c_str());
    good = false;
  }
  return good ? 0 : 1;
}
