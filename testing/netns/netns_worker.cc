// One worker of testing/netns/netns_test.sh: two workers in two network
// namespaces joined by a veth pair. Rank 0 calls rank 1, takes rank 1's link
// down (the process lives on, its packets vanish), checks that a call then
// fails within its timeout, brings the link back and checks that calls work
// again; rank 1 serves until told to stop. Environment: RANK, WORLD_SIZE,
// MASTER_ADDR/PORT (as the launcher sets them), TETHER_TEST_BACKEND (default
// tensorpipe), LISTEN_ADDR (this worker's address in its namespace),
// PEER_LINK_DOWN / PEER_LINK_UP (shell commands rank 0 runs).
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/builtin.h"
#include "core/rpc.h"
#include "testing/test_ops.h"

namespace {

std::string env(const char* name, const char* fallback = "") {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

absl::StatusOr<c10::IValue> add(absl::Duration timeout) {
  return tether::rpc_sync("w1", "aten::add.Tensor",
                          {at::ones({2}), at::ones({2})}, {}, timeout);
}

}  // namespace

int main() {
  const int rank = std::atoi(env("RANK", "-1").c_str());
  tether::BackendRegistry registry;
  if (!tether::backends::register_builtin_backends(registry).ok()) return 1;
  tether::RpcOptions options;
  options.backend = env("TETHER_TEST_BACKEND", "tensorpipe");
  options.default_timeout = absl::Seconds(30);
  if (options.backend == "tensorpipe") {
    // Shared memory does not cross network namespaces: TCP only.
    options.backend_settings["tensorpipe.transports"] = "uv";
    options.backend_settings["tensorpipe.channels"] = "basic";
    options.backend_settings["tensorpipe.address"] = env("LISTEN_ADDR");
  } else if (options.backend == "libfabric") {
    options.backend_settings["libfabric.provider"] = "tcp;ofi_rxm";
    options.backend_settings["libfabric.address"] = env("LISTEN_ADDR");
  }
  absl::Status up = tether::init_rpc(absl::StrCat("w", rank), rank, 2, options,
                                     registry);
  if (!up.ok()) {
    std::printf("FAILED: init: %s\n", up.ToString().c_str());
    return 1;
  }
  if (rank == 1) {
    const bool released =
        tether::testing::wait_for_release(absl::Seconds(120));
    check(released, "told to stop");
    (void)tether::shutdown(/*graceful=*/false);
    return failures == 0 ? 0 : 1;
  }
  check(add(absl::Seconds(10)).ok(), "a call before the link goes down");
  check(std::system(env("PEER_LINK_DOWN").c_str()) == 0, "link down");
  const absl::Time start = absl::Now();
  absl::StatusOr<c10::IValue> lost = add(absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  check(!lost.ok() && (lost.status().code() ==
                           absl::StatusCode::kDeadlineExceeded ||
                       lost.status().code() == absl::StatusCode::kUnavailable),
        absl::StrCat("a call to the unreachable peer fails (",
                     lost.status().ToString(), ")"));
  check(took < absl::Seconds(4),
        absl::StrCat("within its 2 s timeout (took ",
                     absl::FormatDuration(took), ")"));
  check(std::system(env("PEER_LINK_UP").c_str()) == 0, "link up");
  // The connection recovers (TCP retransmits) or is made again.
  bool back = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!back && absl::Now() < deadline) {
    back = add(absl::Seconds(5)).ok();
  }
  check(back, "calls work again once the link is back");
  absl::StatusOr<c10::IValue> told =
      tether::rpc_sync("w1", tether::testing::kRelease, {});
  check(told.ok() || told.status().code() == absl::StatusCode::kUnavailable,
        "rank 1 told to stop");
  (void)tether::shutdown(/*graceful=*/false);
  return failures == 0 ? 0 : 1;
}
