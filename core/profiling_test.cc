// Remote profiling (core/profiling.h) for real: three workers over the
// loopback backend, the caller's thread under LibTorch's legacy profiler.
#include "core/profiling.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <string>
#include <vector>

#include "core/rpc.h"
#include "core/worker.h"
#include "testing/loopback_group.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

namespace legacy = torch::autograd::profiler;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

class Profiling : public tether::testing::LoopbackGroup {
 protected:
  void SetUp() override {
    start(tether::testing::group_options("profiling_test"),
          {"alice", "bob", "carol"}, {});
  }
};

// Runs `work` on this thread under the legacy profiler (recording shapes);
// returns every event it recorded.
template <typename F>
std::vector<legacy::LegacyEvent> profiled(F work) {
  legacy::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(
      torch::profiler::impl::ProfilerState::CPU,
      /*report_input_shapes=*/true));
  work();
  std::vector<legacy::LegacyEvent> out;
  for (auto& list : legacy::disableProfilerLegacy()) {
    for (auto& event : list) out.push_back(event);
  }
  return out;
}

// The push events named `name`.
std::vector<legacy::LegacyEvent> pushes(
    const std::vector<legacy::LegacyEvent>& events, const std::string& name) {
  std::vector<legacy::LegacyEvent> out;
  for (const auto& e : events) {
    if (e.kind() == legacy::EventKind::PushRange && e.name() == name) {
      out.push_back(e);
    }
  }
  return out;
}

std::vector<std::string> names(const std::vector<legacy::LegacyEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.name());
  return out;
}

TEST_F(Profiling, ACallBringsBackItsCalleesEventsUnderItsKey) {
  const at::Tensor a = at::ones({2, 3});
  std::vector<legacy::LegacyEvent> events = profiled([&] {
    profiling::CallKey key("rpc_sync#mul(alice -> bob)");
    EXPECT_THAT(worker(0).rpc_sync("bob", "aten::mul.Tensor", {a, a}),
                IsOk());
  });
  std::vector<legacy::LegacyEvent> mul =
      pushes(events, "rpc_sync#mul(alice -> bob)#remote_op: aten::mul");
  ASSERT_EQ(mul.size(), 1u) << ::testing::PrintToString(names(events));
  EXPECT_TRUE(mul[0].isRemote());
  EXPECT_EQ(mul[0].nodeId(), 1);  // bob
  // The caller's settings travelled: the callee recorded the shapes.
  EXPECT_EQ(mul[0].shapes(),
            (std::vector<std::vector<int64_t>>{{2, 3}, {2, 3}}));
}

TEST_F(Profiling, WithoutAKeyTheWorkerNamesTheCall) {
  const at::Tensor a = at::ones({2});
  std::vector<legacy::LegacyEvent> events = profiled([&] {
    EXPECT_THAT(worker(0).rpc_sync("bob", "aten::add.Tensor", {a, a}),
                IsOk());
  });
  EXPECT_EQ(pushes(events, "CALL(alice -> bob)#remote_op: aten::add").size(),
            1u)
      << ::testing::PrintToString(names(events));
}

TEST_F(Profiling, CallsMadeOnwardComeBackNestedUnderBothKeys) {
  ASSERT_THAT(worker(1).register_function(
                  "relay",
                  [](at::Tensor t) -> absl::StatusOr<at::Tensor> {
                    return rpc_sync<at::Tensor>("carol", "aten::neg", {t});
                  }),
              IsOk());
  std::vector<legacy::LegacyEvent> events = profiled([&] {
    profiling::CallKey key("outer");
    EXPECT_THAT(worker(0).rpc_sync("bob", "relay", {at::ones({2})}), IsOk());
  });
  std::vector<legacy::LegacyEvent> neg = pushes(
      events,
      "outer#remote_op: CALL(bob -> carol)#remote_op: aten::neg");
  ASSERT_EQ(neg.size(), 1u) << ::testing::PrintToString(names(events));
  EXPECT_EQ(neg[0].nodeId(), 2);  // carol, though bob sent it back
  EXPECT_TRUE(neg[0].isRemote());
}

TEST_F(Profiling, MalformedProfiledRequestsAreRefusedNamingWhatIsWrong) {
  const WorkerInfo bob = worker(0).get_all_worker_infos()[1];
  Message garbage;
  garbage.type = MessageType::kProfiledRequest;
  garbage.payload = "\xff\xff\xff";
  EXPECT_THAT(worker(0).send(bob, garbage).get(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("malformed PROFILED_REQUEST")));

  // Only requests that run user code may be profiled: not a probe, not
  // another wrapper.
  Message ping;
  ping.type = MessageType::kPing;
  absl::StatusOr<Message> wrapped_ping =
      wire::wrap_profiled_request(ping, wire::ProfilerSettings());
  ASSERT_THAT(wrapped_ping, IsOk());
  EXPECT_THAT(worker(0).send(bob, *wrapped_ping).get(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("it wraps a PING, not a request that runs "
                                 "user code")));
  absl::StatusOr<Message> twice =
      wire::wrap_profiled_request(*wrapped_ping, wire::ProfilerSettings());
  ASSERT_THAT(twice, IsOk());
  EXPECT_THAT(worker(0).send(bob, *twice).get(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("it wraps a PROFILED_REQUEST")));

  // bob still serves.
  EXPECT_THAT(worker(0).rpc_sync("bob", "aten::add.Tensor",
                                 {at::ones({1}), at::ones({1})}),
              IsOk());
}

}  // namespace
}  // namespace tether
