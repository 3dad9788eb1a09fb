#include "core/rendezvous.h"

#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "testing/ports.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

// Runs the rendezvous of `world_size` threads and returns their results.
std::vector<absl::StatusOr<RendezvousResult>> meet(
    const std::string& init_method, int world_size) {
  std::vector<absl::StatusOr<RendezvousResult>> results(
      world_size, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] = rendezvous(init_method, absl::StrCat("w", rank), rank,
                                 world_size, kBound);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

void expect_group(const std::vector<absl::StatusOr<RendezvousResult>>& results) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    ASSERT_THAT(results[rank], IsOk());
    EXPECT_EQ(results[rank]->self.id, static_cast<int>(rank));
    ASSERT_EQ(results[rank]->workers.size(), results.size());
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_EQ(results[rank]->workers[r].name, absl::StrCat("w", r));
    }
  }
}

TEST(Rendezvous, OverTcpStore) {
  int port = testing::pick_unused_port();
  ASSERT_GT(port, 0);
  expect_group(meet(absl::StrCat("tcp://127.0.0.1:", port), 4));
}

TEST(Rendezvous, OverFileStore) {
  std::string path = absl::StrCat(::testing::TempDir(), "/rdzv_", getpid());
  ::unlink(path.c_str());
  expect_group(meet(absl::StrCat("file://", path), 3));
}

TEST(Rendezvous, EnvReadsMasterAndRankVariables) {
  int port = testing::pick_unused_port();
  ASSERT_GT(port, 0);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", absl::StrCat(port).c_str(), 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("RANK", "0", 1);
  absl::StatusOr<RendezvousResult> result =
      rendezvous("env://", "solo", -1, -1, kBound);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->self.id, 0);
  EXPECT_EQ(result->workers.size(), 1u);
  EXPECT_EQ(result->host, "127.0.0.1");
  ::unsetenv("MASTER_ADDR");
  EXPECT_THAT(rendezvous("env://", "solo", 0, 1, kBound),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("MASTER_ADDR")));
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
}

TEST(Rendezvous, TheHostIsWhereTheStoreIs) {
  EXPECT_EQ(rendezvous_host("tcp://10.1.2.3:29500"), "10.1.2.3");
  EXPECT_EQ(rendezvous_host("tcp://[fd00::1]:29500"), "fd00::1");
  EXPECT_EQ(rendezvous_host("tcp://node7:29500"), "node7");
  EXPECT_EQ(rendezvous_host("file:///shared/rdzv"), "");
  EXPECT_EQ(rendezvous_host("memory://key"), "");
  ::setenv("MASTER_ADDR", "10.9.8.7", 1);
  EXPECT_EQ(rendezvous_host("env://"), "10.9.8.7");
  ::unsetenv("MASTER_ADDR");
  EXPECT_EQ(rendezvous_host("env://"), "");
}

TEST(Rendezvous, SlurmAndOpenMpiVariablesGiveRankAndSize) {
  int port = testing::pick_unused_port();
  ASSERT_GT(port, 0);
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
  absl::StatusOr<RendezvousResult> result = rendezvous(
      absl::StrCat("tcp://127.0.0.1:", port), "slurm0", -1, -1, kBound);
  ::unsetenv("SLURM_PROCID");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->self.name, "slurm0");
}

TEST(Rendezvous, BadInputIsInvalidArgument) {
  EXPECT_THAT(rendezvous("carrier://x", "w", 0, 1, kBound),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("carrier://x")));
  EXPECT_THAT(rendezvous("tcp://nohostport", "w", 0, 1, kBound),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("HOST:PORT")));
  EXPECT_THAT(rendezvous("memory://k", "", 0, 1, kBound),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(rendezvous("memory://k", "w", 0, 70000, kBound),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world_size")));
  EXPECT_THAT(rendezvous("memory://k", "w", -1, 2, kBound),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK")));
}

TEST(Rendezvous, DynamicAndStaticMembersDoNotMix) {
  ASSERT_THAT(rendezvous("memory://mix_dynamic_first", "d", 0, kDynamicGroup,
                         kBound)
                  .status(),
              IsOk());
  // The peer's text first, then who and where.
  EXPECT_THAT(rendezvous("memory://mix_dynamic_first", "s", 1, 2, kBound),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(StartsWith("RPC group mixes statically and "
                                        "dynamically initialized members "
                                        "which is not supported. Rank 1 "
                                        "('s') cannot join the group at "
                                        "'memory://mix_dynamic_first'"),
                             HasSubstr("this worker gave world size 2"))));
  // The dynamic group runs on: another dynamic worker may still come.
  EXPECT_THAT(rendezvous("memory://mix_dynamic_first", "d2", 2, kDynamicGroup,
                         kBound)
                  .status(),
              IsOk());

  // A static rank 0 alone claims the world size, then times out waiting.
  EXPECT_THAT(rendezvous("memory://mix_static_first", "s", 0, 2,
                         absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(rendezvous("memory://mix_static_first", "d", 1, kDynamicGroup,
                         kBound),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("mixes statically and dynamically")));
}

TEST(Rendezvous, ADynamicWorkerNeedsARank) {
  unsetenv("RANK");
  unsetenv("SLURM_PROCID");
  unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_THAT(rendezvous("memory://dyn_rank", "w", -1, kDynamicGroup, kBound),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("dynamic group needs its rank"),
                             HasSubstr("RANK"))));
  EXPECT_THAT(rendezvous("memory://dyn_rank", "w", 70000, kDynamicGroup,
                         kBound),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 70000")));
}

// Runs `names.size()` ranks (rank i with names[i], ranks[i], sizes[i]) and
// returns how each ended and how long the slowest took.
std::vector<absl::Status> meet_as(const std::string& init,
                                  const std::vector<std::string>& names,
                                  const std::vector<int>& ranks,
                                  const std::vector<int>& sizes,
                                  absl::Duration* slowest) {
  std::vector<absl::Status> results(names.size());
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < names.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] =
          rendezvous(init, names[i], ranks[i], sizes[i], kBound).status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  *slowest = absl::Now() - start;
  return results;
}

// A group that cannot form tells every rank why at once, not the one that
// found out while the others wait out the init timeout (kBound, 30 s).
TEST(Rendezvous, DuplicateRankFailsEveryRankAtOnce) {
  absl::Duration slowest;
  std::vector<absl::Status> results =
      meet_as("memory://dup_rank", {"n0", "n1"}, {0, 0}, {2, 2}, &slowest);
  for (const absl::Status& result : results) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kAlreadyExists,
                                 HasSubstr("rank 0 is already taken")));
  }
  EXPECT_LT(slowest, absl::Seconds(10));
}

TEST(Rendezvous, DuplicateNameFailsEveryRankAtOnce) {
  int port = testing::pick_unused_port();
  ASSERT_GT(port, 0);
  absl::Duration slowest;
  std::vector<absl::Status> results =
      meet_as(absl::StrCat("tcp://127.0.0.1:", port), {"same", "same", "w2"},
              {0, 1, 2}, {3, 3, 3}, &slowest);
  for (const absl::Status& result : results) {
    EXPECT_THAT(result,
                StatusIs(absl::StatusCode::kAlreadyExists,
                         HasSubstr("worker name 'same' is already taken")));
  }
  EXPECT_LT(slowest, absl::Seconds(10));
}

TEST(Rendezvous, DisagreeingWorldSizesFailEveryRankAtOnce) {
  absl::Duration slowest;
  std::vector<absl::Status> results =
      meet_as("memory://sizes", {"a", "b"}, {0, 1}, {2, 3}, &slowest);
  for (const absl::Status& result : results) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("world size")));
  }
  EXPECT_LT(slowest, absl::Seconds(10));
}

TEST(Rendezvous, UnreachableTcpStoreFailsInBoundedTime) {
  int port = testing::pick_unused_port();
  ASSERT_GT(port, 0);
  absl::Time start = absl::Now();
  // Rank 1 is a client; nobody serves the store.
  EXPECT_THAT(rendezvous(absl::StrCat("tcp://127.0.0.1:", port), "w1", 1, 2,
                         absl::Seconds(1)),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

}  // namespace
}  // namespace tether
