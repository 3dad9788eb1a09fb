#include "backends/common/peer_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "testing/status_matchers.h"

namespace tether::backends::common {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

absl::StatusOr<std::string> as_is(const std::string& published) {
  return published;
}

TEST(PeerTable, JoinLeaveAndRejoinWithTheSameRank) {
  PeerTable table({{"a", 0}, {"b", 2}});
  EXPECT_EQ(table.by_name("b")->info.id, 2);
  EXPECT_FALSE(table.by_rank(1).has_value());
  EXPECT_EQ(table.name_of(1), "rank 1");
  ASSERT_THAT(table.add({{"c", 1}, "addr-c"}), IsOk());
  EXPECT_EQ(table.by_rank(1)->address, "addr-c");
  EXPECT_THAT(table.add({{"c", 1}, "addr-c"}), IsOk());  // again: OK
  EXPECT_THAT(table.add({{"d", 1}, "addr-d"}),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("rank 1 belongs to worker 'c'")));
  EXPECT_THAT(table.add({{"c", 5}, "addr-c"}),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("worker 'c' has rank 1")));
  EXPECT_FALSE(table.remove({"d", 1}));  // not who holds rank 1
  EXPECT_TRUE(table.remove({"c", 1}));
  EXPECT_FALSE(table.by_name("c").has_value());
  ASSERT_THAT(table.add({{"d", 1}, "addr-d"}), IsOk());
  EXPECT_EQ(table.by_name("d")->address, "addr-d");
}

TEST(PeerAddresses, AJoinerIsLookedUpFromTheStore) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  PeerTable table({{"a", 0}});
  EXPECT_THAT(add_peer(*store, "x/", /*dynamic=*/true, {"b", 3}, table, as_is,
                       "agent of 'a'"),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("no address of worker 'b' (rank 3)")));
  ASSERT_THAT(publish_address(*store, "x/", 3, "host:3", "agent of 'b'"),
              IsOk());
  EXPECT_THAT(add_peer(*store, "x/", /*dynamic=*/false, {"b", 3}, table,
                       as_is, "agent of 'a'"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("static group")));
  ASSERT_THAT(add_peer(*store, "x/", /*dynamic=*/true, {"b", 3}, table, as_is,
                       "agent of 'a'"),
              IsOk());
  EXPECT_EQ(table.by_name("b")->address, "host:3");
}

}  // namespace
}  // namespace tether::backends::common
