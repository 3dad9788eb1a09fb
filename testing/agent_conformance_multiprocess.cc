#include "testing/agent_conformance_multiprocess.h"

#include <absl/strings/str_cat.h>
#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "core/rendezvous.h"
#include "testing/agent_checks.h"
#include "testing/agent_testing.h"
#include "testing/multiprocess.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

// How long a whole test may run before its processes are killed.
constexpr absl::Duration kDeadline = absl::Seconds(120);

constexpr char kDoneKey[] = "conformance/done";

std::string left_key(int rank) {
  return absl::StrCat("conformance/left/", rank);
}

// Waits until `key` is set in `store`, up to `timeout`; a test failure if it
// is not.
void wait_for_key(c10d::Store& store, const std::string& key,
                  absl::Duration timeout) {
  try {
    store.wait({key}, std::chrono::milliseconds(
                          absl::ToInt64Milliseconds(timeout)));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "waiting for '" << key << "' in the store: " << e.what();
  }
}

// This process's worker of the group that run_in_processes started: its
// agent, and the handler that holds responses if the test wants one.
class Process {
 public:
  Process(RendezvousResult member, std::unique_ptr<Agent> agent)
      : member_(std::move(member)), agent_(std::move(agent)) {}

  int rank() const { return member_.self.id; }
  Agent& agent() { return *agent_; }
  const WorkerInfo& worker(int rank) const { return member_.workers[rank]; }
  HeldResponses& held() { return *held_; }

  void start(RequestHandler handler) {
    ASSERT_THAT(agent_->start(std::move(handler)), IsOk());
  }

  // Serves with held(), which a RemoteHeld on another rank drives.
  void start_holding() {
    start([held = held_](Message request) {
      return held->hold_or_obey(std::move(request));
    });
  }

  // The end of every test, so that no process leaves while another needs
  // it. Rank 0 says it is done and waits until every peer not in `dead` has
  // shut down (its process serves the store). A peer waits for that word,
  // releases what it still holds (to a sender that may have shut down: the
  // responses must be dropped harmlessly) and shuts down.
  void finish(const std::vector<int>& dead) {
    c10d::Store& store = *member_.store;
    if (rank() == 0) {
      store.set(kDoneKey, {1});
      for (int peer = 1; peer < static_cast<int>(member_.workers.size());
           ++peer) {
        if (std::find(dead.begin(), dead.end(), peer) != dead.end()) continue;
        wait_for_key(store, left_key(peer), kBound);
      }
      agent_->shutdown();
      return;
    }
    wait_for_key(store, kDoneKey, kDeadline);
    held_->release_all();
    agent_->shutdown();
    store.set(left_key(rank()), {1});
  }

 private:
  const RendezvousResult member_;  // outlives the agent
  const std::unique_ptr<Agent> agent_;
  const std::shared_ptr<HeldResponses> held_ =
      std::make_shared<HeldResponses>();
};

// Runs `body` in `world_size` processes of the backend under test: each
// meets the group through env://, builds its agent, runs `body` and
// finishes (Process::finish). Ranks in `may_die` may be killed. Rank r's
// agent gets limits[r] (AgentSetup::limits; the defaults beyond `limits`).
void run_across_processes(const ConformanceParam& param, int world_size,
                          const std::function<void(Process&)>& body,
                          const std::vector<int>& may_die = {},
                          const std::vector<MessageLimits>& limits = {}) {
  run_in_processes(
      world_size,
      [&param, &body, &may_die, &limits](int rank, int world) {
        absl::StatusOr<RendezvousResult> member =
            meet_as_agent("env://", rank, world);
        ASSERT_THAT(member, IsOk());
        absl::StatusOr<std::unique_ptr<Agent>> agent = create_agent(
            param.backend(), *member, {},
            rank < static_cast<int>(limits.size()) ? limits[rank]
                                                   : MessageLimits());
        ASSERT_THAT(agent, IsOk());
        Process process(*std::move(member), *std::move(agent));
        body(process);
        process.finish(may_die);
      },
      kDeadline, may_die);
}

// The common shape: 2 processes; rank 1 serves with `handler`, rank 0 runs
// `check` against it.
void check_against_peer(
    const ConformanceParam& param, const RequestHandler& handler,
    const std::function<void(Agent& from, const WorkerInfo& to)>& check) {
  run_across_processes(param, 2, [&handler, &check](Process& p) {
    p.start(handler);
    if (p.rank() == 0) check(p.agent(), p.worker(1));
  });
}

// The same against a rank 1 that holds responses until rank 0 releases them
// by messages; what is still held at the end is released then, after rank 0
// may have shut down. Rank 1 takes `holder_limits` (AgentSetup::limits).
void check_against_holder(
    const ConformanceParam& param,
    const std::function<void(Agent& from, const WorkerInfo& to,
                             HeldControl& held)>& check,
    const MessageLimits& holder_limits = MessageLimits()) {
  run_across_processes(
      param, 2,
      [&check](Process& p) {
        if (p.rank() != 0) {
          p.start_holding();
          return;
        }
        p.start(echo);
        RemoteHeld held(p.agent(), p.worker(1));
        check(p.agent(), p.worker(1), held);
      },
      {}, {MessageLimits(), holder_limits});
}

TEST_P(AgentConformanceMultiprocess,
       RequestAndResponseCarryPayloadAndStorages) {
  check_against_peer(GetParam(), echo, expect_round_trip_with_storages);
}

TEST_P(AgentConformanceMultiprocess, WorkerInfosInRankOrder) {
  run_across_processes(GetParam(), 3, [](Process& p) {
    expect_worker_infos(p.agent(), p.rank(), 3);
  });
}

TEST_P(AgentConformanceMultiprocess, ManyRequestsInFlightBothWays) {
  run_across_processes(GetParam(), 2, [](Process& p) {
    p.start(echo);
    // Each rank sends the calls of its parity and checks their responses
    // while it serves the other's.
    constexpr int kCalls = 1000;
    std::vector<Future<Message>> calls;
    for (int i = p.rank(); i < kCalls; i += 2) {
      calls.push_back(send_call(p.agent(), p.worker(1 - p.rank()), i));
    }
    for (size_t k = 0; k < calls.size(); ++k) {
      expect_call_echoed(calls[k], p.rank() + 2 * static_cast<int>(k));
    }
  });
}

TEST_P(AgentConformanceMultiprocess, LargeStorageRoundTrip) {
  check_against_peer(GetParam(), echo, expect_large_storage_round_trip);
}

TEST_P(AgentConformanceMultiprocess, HandlerErrorReachesSenderWithCodeAndText) {
  check_against_peer(GetParam(), refuse, expect_handler_error);
}

TEST_P(AgentConformanceMultiprocess, UnknownPeerIsUnavailable) {
  check_against_peer(GetParam(), echo, [](Agent& from, const WorkerInfo&) {
    expect_unknown_peer_unavailable(from);
  });
}

TEST_P(AgentConformanceMultiprocess, TimeoutFailsWithDeadlineExceeded) {
  check_against_holder(GetParam(), expect_timeout_then_working);
}

TEST_P(AgentConformanceMultiprocess,
       RequestThatTimesOutBeforeItLeavesIsStillDelivered) {
  check_against_holder(GetParam(),
                       expect_timed_out_before_leaving_still_delivered);
}

TEST_P(AgentConformanceMultiprocess,
       RequestOverTheCalleesLimitsIsRefusedNotTheConnection) {
  check_against_holder(GetParam(), expect_over_limits_refused, small_limits());
}

TEST_P(AgentConformanceMultiprocess, ShutdownCancelsPendingAndLaterSends) {
  check_against_holder(GetParam(), expect_shutdown_cancels);
}

TEST_P(AgentConformanceMultiprocess, JoinWaitsForRequestsInFlight) {
  run_across_processes(GetParam(), 3, [](Process& p) {
    if (p.rank() == 1) {
      p.start_holding();
    } else {
      p.start(echo);
    }
    if (p.rank() != 0) {
      // Rank 1 joins holding rank 0's request; rank 2 has no traffic.
      EXPECT_THAT(p.agent().join(kBound), IsOk());
      return;
    }
    Future<Message> call = p.agent().send(p.worker(1), ping("j"), kBound);
    RemoteHeld held(p.agent(), p.worker(1));
    held.wait_for(1);
    absl::Notification joined;
    absl::Status result;
    std::thread joiner([&p, &joined, &result] {
      result = p.agent().join(kBound);
      joined.Notify();
    });
    // Nobody leaves join() while the request is held: give it the chance.
    EXPECT_FALSE(joined.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
    EXPECT_FALSE(call.is_ready());
    // Sent while joining: join() waits for this request too.
    held.release_all();
    joiner.join();  // bounded by join's own timeout
    EXPECT_THAT(result, IsOk());
    absl::StatusOr<Message> response = call.get(absl::Now() + kBound);
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->payload, "j/late");
  });
}

TEST_P(AgentConformanceMultiprocess, JoinTimesOutWhenAPeerNeverJoins) {
  run_across_processes(GetParam(), 2, [](Process& p) {
    p.start(echo);
    if (p.rank() == 0) {
      EXPECT_THAT(p.agent().join(absl::Milliseconds(200)),
                  StatusIs(absl::StatusCode::kDeadlineExceeded));
    }
  });
}

TEST_P(AgentConformanceMultiprocess, KilledPeerFailsPendingRequests) {
  run_across_processes(
      GetParam(), 3,
      [](Process& p) {
        if (p.rank() == 1) {
          p.start_holding();
          p.held().wait_for(3);
          // Dies holding them, without a word on any connection.
          ::kill(::getpid(), SIGKILL);
          ADD_FAILURE() << "alive after SIGKILL";
          return;
        }
        p.start(echo);
        if (p.rank() != 0) return;
        const absl::Time start = absl::Now();
        std::vector<Future<Message>> pending;
        for (int i = 0; i < 3; ++i) {
          // No timeout: only the loss of the peer can end them.
          pending.push_back(p.agent().send(p.worker(1), ping("p"),
                                           absl::InfiniteDuration()));
        }
        for (Future<Message>& future : pending) {
          EXPECT_THAT(future.get(absl::Now() + kBound),
                      StatusIs(absl::StatusCode::kUnavailable));
        }
        std::printf("requests to the killed peer failed after %s\n",
                    absl::FormatDuration(absl::Now() - start).c_str());
        // Later sends to it fail too; the survivors keep working.
        EXPECT_THAT(p.agent()
                        .send(p.worker(1), ping("again"), kBound)
                        .get(absl::Now() + kBound),
                    StatusIs(absl::StatusCode::kUnavailable));
        absl::StatusOr<Message> alive =
            p.agent()
                .send(p.worker(2), ping("alive"), kBound)
                .get(absl::Now() + kBound);
        ASSERT_THAT(alive, IsOk());
        EXPECT_EQ(alive->payload, "alive/pong");
      },
      /*may_die=*/{1});
}

}  // namespace
}  // namespace tether::testing
