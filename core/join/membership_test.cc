#include "core/join/membership.h"

#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "testing/status_matchers.h"

namespace tether::join {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

std::shared_ptr<c10d::Store> make_store() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  return std::shared_ptr<c10d::Store>(store.get(), [store](c10d::Store*) {});
}

std::vector<uint8_t> bytes(absl::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(Members, FormatAndParseRoundTripInRankOrder) {
  std::vector<WorkerInfo> members = {{"c", 7}, {"a", 0}, {"b", 3}};
  absl::StatusOr<std::vector<WorkerInfo>> parsed =
      parse_members(format_members(members));
  ASSERT_THAT(parsed.status(), IsOk());
  EXPECT_THAT(*parsed, ElementsAre(WorkerInfo{"a", 0}, WorkerInfo{"b", 3},
                                   WorkerInfo{"c", 7}));
}

TEST(Members, AMalformedLineIsNamed) {
  EXPECT_THAT(parse_members("0:a\nnonsense\n").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'nonsense'")));
}

TEST(MembershipToken, OneHolderAtATime) {
  auto store = make_store();
  auto first = MembershipToken::acquire(store, {"a", 0},
                                        MembershipToken::Op::kJoin,
                                        absl::Seconds(10), absl::Now() + kBound);
  ASSERT_THAT(first.status(), IsOk());
  absl::Notification second_has_it;
  std::thread waiter([&] {
    auto second = MembershipToken::acquire(
        store, {"b", 1}, MembershipToken::Op::kJoin, absl::Seconds(10),
        absl::Now() + kBound);
    EXPECT_THAT(second.status(), IsOk());
    if (second.ok()) EXPECT_FALSE((*second)->lost_holder().has_value());
    second_has_it.Notify();
  });
  // The first holder's heartbeat moves: the second waits, however long.
  EXPECT_FALSE(second_has_it.WaitForNotificationWithTimeout(absl::Seconds(1)));
  first->reset();
  EXPECT_TRUE(second_has_it.WaitForNotificationWithTimeout(kBound));
  waiter.join();
}

TEST(MembershipToken, AnAliveHolderIsNotTakenOverAndTheWaitNamesIt) {
  auto store = make_store();
  auto holder = MembershipToken::acquire(
      store, {"a", 0}, MembershipToken::Op::kLeave, absl::Seconds(10),
      absl::Now() + kBound, absl::Milliseconds(20));
  ASSERT_THAT(holder.status(), IsOk());
  auto waiter = MembershipToken::acquire(
      store, {"b", 1}, MembershipToken::Op::kJoin,
      /*peer_timeout=*/absl::Milliseconds(300), absl::Now() + absl::Seconds(1));
  EXPECT_THAT(waiter.status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("worker 'b' (rank 1)"),
                             HasSubstr("held by worker 'a' (rank 0, leaving)"))));
}

TEST(MembershipToken, ALostHolderIsTakenOverAndForgotten) {
  auto store = make_store();
  // What a joiner killed while it held the token leaves behind: the token,
  // its claims, and (if it got that far) its line in the member list.
  store->set("tether/members/token", bytes("5:dead:join:42"));
  store->set("tether/name/dead", bytes("5"));
  store->set("tether/rank/5", bytes("dead"));
  store->set("tether/members", bytes("0:a\n5:dead\n"));
  const absl::Time start = absl::Now();
  auto token = MembershipToken::acquire(
      store, {"b", 1}, MembershipToken::Op::kJoin,
      /*peer_timeout=*/absl::Milliseconds(300), absl::Now() + kBound);
  ASSERT_THAT(token.status(), IsOk());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  ASSERT_TRUE((*token)->lost_holder().has_value());
  EXPECT_EQ(*(*token)->lost_holder(), (WorkerInfo{"dead", 5}));
  EXPECT_FALSE(store->check({"tether/name/dead"}));
  EXPECT_FALSE(store->check({"tether/rank/5"}));
  absl::StatusOr<std::vector<WorkerInfo>> members = (*token)->members();
  ASSERT_THAT(members.status(), IsOk());
  EXPECT_THAT(*members, ElementsAre(WorkerInfo{"a", 0}));
  // The new holder may claim the freed rank.
  EXPECT_THAT((*token)->claim(), IsOk());
}

TEST(MembershipToken, ClaimsRefuseATakenNameOrRank) {
  auto store = make_store();
  {
    auto a = MembershipToken::acquire(store, {"a", 0},
                                      MembershipToken::Op::kJoin,
                                      absl::Seconds(10), absl::Now() + kBound);
    ASSERT_THAT(a.status(), IsOk());
    ASSERT_THAT((*a)->claim(), IsOk());
  }
  auto same_name = MembershipToken::acquire(
      store, {"a", 1}, MembershipToken::Op::kJoin, absl::Seconds(10),
      absl::Now() + kBound);
  ASSERT_THAT(same_name.status(), IsOk());
  EXPECT_THAT((*same_name)->claim(),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("worker name 'a' is already taken by rank 0")));
  same_name->reset();
  auto same_rank = MembershipToken::acquire(
      store, {"b", 0}, MembershipToken::Op::kJoin, absl::Seconds(10),
      absl::Now() + kBound);
  ASSERT_THAT(same_rank.status(), IsOk());
  EXPECT_THAT((*same_rank)->claim(),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("rank 0 is already taken by worker 'a'")));
  // A refused rank leaves the name free.
  EXPECT_FALSE(store->check({"tether/name/b"}));
  // Forgotten, the name and rank are free again.
  ASSERT_THAT((*same_rank)->forget({"a", 0}), IsOk());
  EXPECT_THAT((*same_rank)->claim(), IsOk());
}

}  // namespace
}  // namespace tether::join
