// Graceful shutdown across real worker processes, on the backend named by
// TETHER_TEST_BACKEND: waiting is bounded by liveness, not by a timeout.
//
// - a worker that is alive and working keeps the others' shutdown waiting
//   for as long as its work lasts, far past the peer timeout;
// - a killed worker ends every survivor's shutdown within seconds, naming
//   it, with no overall timeout set;
// - a killed rank 0 (whose process serves the rendezvous store) is an error
//   Status for the survivors, never an abort.
#include <ATen/ATen.h>
#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "backends/builtin.h"
#include "core/rpc.h"
#include "testing/multiprocess.h"
#include "testing/scenario_backend.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

// A short peer timeout: a healthy run must outlast it many times over.
constexpr absl::Duration kPeerTimeout = absl::Milliseconds(500);

void init(int rank, int world_size, absl::Duration peer_timeout,
          const absl::flat_hash_map<std::string, std::string>& settings = {}) {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry;
    EXPECT_THAT(backends::register_builtin_backends(*r), IsOk());
    return r;
  }();
  RpcOptions options;
  options.backend = ::tether::testing::backend_under_test();
  options.backend_settings = ::tether::testing::backend_settings_under_test();
  for (const auto& [key, value] : settings) {
    options.backend_settings.try_emplace(key, value);
  }
  options.init_method = "env://";
  options.num_worker_threads = 4;
  options.default_timeout = absl::Seconds(60);
  options.peer_timeout = peer_timeout;
  // shutdown_timeout stays at its default: none.
  ASSERT_THAT(init_rpc(absl::StrCat("w", rank), rank, world_size, options,
                       *registry),
              IsOk());
}

std::string name_of(int rank) { return absl::StrCat("w", rank); }

// A survivor's graceful shutdown fails with UNAVAILABLE saying `what`,
// within seconds.
void expect_shutdown_fails_fast(int rank, const std::string& what) {
  const absl::Time start = absl::Now();
  absl::Status down = shutdown();
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(down, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(what)));
  EXPECT_LT(took, absl::Seconds(15));
  std::printf("%s: shutdown failed after %s: %s\n", name_of(rank).c_str(),
              absl::FormatDuration(took).c_str(), down.ToString().c_str());
}

// The parameter-server pattern of the main job: rank 0 shuts down at once
// and waits while rank 1 keeps calling it for many peer timeouts.
TEST(ShutdownScenarios, WaitsForALiveWorkerAsLongAsItWorks) {
  ::tether::testing::run_in_processes(3, [](int rank, int world) {
    init(rank, world, kPeerTimeout);
    const absl::Time start = absl::Now();
    if (rank == 1) {
      int calls = 0;
      while (absl::Now() - start < 8 * kPeerTimeout) {
        ASSERT_THAT(rpc_sync(name_of(0), "aten::add.Tensor",
                             {at::ones({4}), at::ones({4})}),
                    IsOk());
        ++calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::printf("w1 worked %s (%d calls) before its shutdown\n",
                  absl::FormatDuration(absl::Now() - start).c_str(), calls);
    }
    EXPECT_THAT(shutdown(), IsOk());
    if (rank != 1) {
      EXPECT_GE(absl::Now() - start, 8 * kPeerTimeout);
      std::printf("%s's shutdown waited %s\n", name_of(rank).c_str(),
                  absl::FormatDuration(absl::Now() - start).c_str());
    }
  });
}

// A worker killed while the others wait in shutdown: they fail fast naming
// it. The peer timeout is long here (60 s): a killed process is found by
// its refused connection, not by silence.
TEST(ShutdownScenarios, AKilledWorkerEndsTheOthersShutdownFastNamingIt) {
  ::tether::testing::run_in_processes(
      3,
      [](int rank, int world) {
        init(rank, world, absl::Seconds(60));
        if (rank == 2) {
          // Working, then killed before it reaches shutdown.
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          ::kill(::getpid(), SIGKILL);
        }
        expect_shutdown_fails_fast(rank, "worker 'w2' (rank 2) is lost");
      },
      absl::Seconds(120), /*may_die=*/{2});
}

// Rank 0 serves the store (env:// without a launcher's store) and is
// killed: the survivors' shutdown fails with a Status naming it; their
// processes live on (LibTorch's TCPStore client aborted or spun here).
TEST(ShutdownScenarios, AKilledRankZeroIsAnErrorForTheOthersNotAnAbort) {
  ::tether::testing::run_in_processes(
      3,
      [](int rank, int world) {
        init(rank, world, absl::Seconds(60));
        if (rank == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          ::kill(::getpid(), SIGKILL);
        }
        expect_shutdown_fails_fast(rank, "rank 0");
        // Still alive and well a while later (no watch thread to abort).
        std::this_thread::sleep_for(std::chrono::seconds(1));
      },
      absl::Seconds(120), /*may_die=*/{0});
}

// A worker stopped (SIGSTOP) for less than the peer timeout is slow, not
// lost: the group waits and everyone shuts down cleanly.
TEST(ShutdownScenarios, AWorkerStoppedWithinThePeerTimeoutIsWaitedFor) {
  ::tether::testing::run_in_processes(3, [](int rank, int world) {
    init(rank, world, absl::Seconds(20));
    if (rank == 2) {
      // Stops itself; a child process resumes it 2 s later.
      const pid_t self = ::getpid();
      if (::fork() == 0) {
        ::usleep(2000 * 1000);
        ::kill(self, SIGCONT);
        ::_exit(0);
      }
      ::kill(self, SIGSTOP);
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

// A worker stopped mid-call for longer than a backend's own liveness would
// bear by default (gRPC: keepalive_ms + 5 s, here 0.2 + 5 s; libfabric:
// 10 s) but within the group's peer timeout: the backend bears it as long
// as the group does, the calls to it are answered once it runs again, and
// everyone shuts down cleanly.
TEST(ShutdownScenarios, AWorkerStoppedMidCallPastABackendsOwnDefaultIsWaitedFor) {
  constexpr absl::Duration kStopped = absl::Seconds(11);
  ::tether::testing::run_in_processes(3, [kStopped](int rank, int world) {
    // gRPC's keepalive pings every 200 ms, so that its 5 s default would
    // lose the stopped worker well within the stop.
    init(rank, world, absl::Seconds(30), {{"grpc.keepalive_ms", "200"}});
    if (rank == 2) {
      const pid_t self = ::getpid();
      if (::fork() == 0) {
        ::usleep(absl::ToInt64Microseconds(kStopped));
        ::kill(self, SIGCONT);
        ::_exit(0);
      }
      ::kill(self, SIGSTOP);
    } else {
      // w2 stops itself as init_rpc returns; the calls go once it has.
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const absl::Time start = absl::Now();
      absl::StatusOr<at::IValue> sum = rpc_sync(
          name_of(2), "aten::add.Tensor", {at::ones({4}), at::ones({4})});
      ASSERT_THAT(sum, IsOk());
      EXPECT_TRUE(sum->toTensor().equal(at::full({4}, 2.0)));
      const absl::Duration took = absl::Now() - start;
      std::printf("%s's call to the stopped w2 took %s\n",
                  name_of(rank).c_str(), absl::FormatDuration(took).c_str());
      // It waited for the stop (else the test showed nothing).
      EXPECT_GT(took, kStopped / 2);
    }
    EXPECT_THAT(shutdown(), IsOk());
  });
}

}  // namespace
}  // namespace tether
