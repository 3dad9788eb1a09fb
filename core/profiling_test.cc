// Remote profiling (core/profiling.h) for real: three workers over the
// loopback backend, the caller's thread under LibTorch's legacy profiler.
#include "core/profiling.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rpc.h"
#include "core/worker.h"
#include "testing/legacy_profile.h"
#include "testing/loopback_group.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::tether::testing::event_names;
using ::tether::testing::legacy_profile;
using ::tether::testing::LegacyEvents;
using ::tether::testing::pushes_named;
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

TEST_F(Profiling, ACallBringsBackItsCalleesEventsUnderItsKey) {
  const at::Tensor a = at::ones({2, 3});
  LegacyEvents events = legacy_profile([&] {
    profiling::CallKey key("rpc_sync#mul(alice -> bob)");
    EXPECT_THAT(worker(0).rpc_sync("bob", "aten::mul.Tensor", {a, a}),
                IsOk());
  });
  LegacyEvents mul = pushes_named(
      events, "rpc_sync#mul(alice -> bob)#remote_op: aten::mul");
  ASSERT_EQ(mul.size(), 1u) << ::testing::PrintToString(event_names(events));
  EXPECT_TRUE(mul[0].isRemote());
  EXPECT_EQ(mul[0].nodeId(), 1);  // bob
  // The caller's settings travelled: the callee recorded the shapes.
  EXPECT_EQ(mul[0].shapes(),
            (std::vector<std::vector<int64_t>>{{2, 3}, {2, 3}}));
}

TEST_F(Profiling, WithoutAKeyTheWorkerNamesTheCall) {
  const at::Tensor a = at::ones({2});
  LegacyEvents events = legacy_profile([&] {
    EXPECT_THAT(worker(0).rpc_sync("bob", "aten::add.Tensor", {a, a}),
                IsOk());
  });
  EXPECT_EQ(
      pushes_named(events, "CALL(alice -> bob)#remote_op: aten::add").size(),
      1u)
      << ::testing::PrintToString(event_names(events));
}

TEST_F(Profiling, CallsMadeOnwardComeBackNestedUnderBothKeys) {
  ASSERT_THAT(worker(1).register_function(
                  "relay",
                  [](at::Tensor t) -> absl::StatusOr<at::Tensor> {
                    return rpc_sync<at::Tensor>("carol", "aten::neg", {t});
                  }),
              IsOk());
  LegacyEvents events = legacy_profile([&] {
    profiling::CallKey key("outer");
    EXPECT_THAT(worker(0).rpc_sync("bob", "relay", {at::ones({2})}), IsOk());
  });
  LegacyEvents neg = pushes_named(
      events,
      "outer#remote_op: CALL(bob -> carol)#remote_op: aten::neg");
  ASSERT_EQ(neg.size(), 1u) << ::testing::PrintToString(event_names(events));
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
