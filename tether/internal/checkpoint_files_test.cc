// The files of a checkpoint directory: names that stay in it, the marker's
// text, atomic writes, and which steps are complete.
#include "tether/internal/checkpoint_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "testing/status_matchers.h"
#include "tether/internal/checkpoint_testing.h"

namespace tether::internal {
namespace {

namespace fs = std::filesystem;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

TEST(CheckpointFiles, NamesStayInTheirDirectory) {
  EXPECT_EQ(part_file("trainer1", "trainer1"), "trainer1.pt");
  EXPECT_EQ(part_file("ps", "trainer1"), "ps.for-trainer1.pt");
  EXPECT_EQ(part_file("../etc", "a b"), "%2E.%2Fetc.for-a%20b.pt");
  EXPECT_EQ(step_directory("ckpt/", 40), "ckpt/step-00000040");
  EXPECT_EQ(step_directory("./a//b/.", 123456789), "a/b/step-123456789");
  EXPECT_EQ(normal_directory("/data/run/"), "/data/run");
  EXPECT_EQ(normal_directory("/"), "/");
}

TEST(CheckpointFiles, TheMarkerReadsBackAndRefusesOtherText) {
  Manifest manifest;
  manifest.step = 40;
  manifest.members = {"trainer 1", "trainer2"};
  manifest.files = {{"ps.for-trainer2.pt", 1234}, {"trainer2.pt", 56}};
  const std::string text = format_manifest(manifest);
  EXPECT_EQ(text,
            "tether checkpoint 1\nstep 40\nmember trainer%201\n"
            "member trainer2\nfile ps.for-trainer2.pt 1234\n"
            "file trainer2.pt 56\n");
  absl::StatusOr<Manifest> parsed = parse_manifest(text, "m");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->step, 40);
  EXPECT_EQ(parsed->members, manifest.members);
  EXPECT_EQ(parsed->files, manifest.files);
  EXPECT_THAT(parse_manifest("step 3\n", "dir/COMPLETE"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'dir/COMPLETE' is not a checkpoint's "
                                 "marker")));
  EXPECT_THAT(parse_manifest("tether checkpoint 1\nfile a -1\n", "m"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("line 2 is 'file a -1'")));
  EXPECT_THAT(
      parse_manifest("tether checkpoint 1\nmember a\n", "m"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("names no step")));
}

TEST(CheckpointFiles, WritesReplaceWholeFilesAndLeaveNoTemporary) {
  const std::string dir = fresh_dir("checkpoint_files_atomic");
  ASSERT_THAT(make_directories(dir + "/a/b"), IsOk());
  const std::string path = dir + "/a/b/part.pt";
  ASSERT_THAT(write_file_atomically(path, "first"), IsOk());
  ASSERT_THAT(write_file_atomically(path, "second, longer"), IsOk());
  absl::StatusOr<std::string> read = read_file(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, "second, longer");
  EXPECT_THAT(files_of(dir + "/a/b"), ElementsAre("part.pt"));
  EXPECT_THAT(write_file_atomically(dir + "/missing/part.pt", "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
  EXPECT_THAT(read_file(dir + "/none"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(CheckpointFiles, CompleteStepsHaveTheirMarker) {
  const std::string dir = fresh_dir("checkpoint_files_steps");
  absl::StatusOr<Steps> none = list_steps(dir);  // not there yet
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->all.empty());
  for (int64_t step : {20, 3, 100}) {
    ASSERT_THAT(make_directories(step_directory(dir, step)), IsOk());
  }
  ASSERT_THAT(write_file_atomically(step_directory(dir, 3) + "/COMPLETE", ""),
              IsOk());
  ASSERT_THAT(write_file_atomically(step_directory(dir, 100) + "/COMPLETE", ""),
              IsOk());
  fs::create_directory(dir + "/step-x");
  std::ofstream(dir + "/step-00000007") << "a file, not a step";
  absl::StatusOr<Steps> steps = list_steps(dir);
  ASSERT_THAT(steps, IsOk());
  EXPECT_THAT(steps->all, ElementsAre(3, 20, 100));
  EXPECT_THAT(steps->complete, ElementsAre(3, 100));
  ASSERT_THAT(remove_step_directory(step_directory(dir, 100)), IsOk());
  steps = list_steps(dir);
  ASSERT_THAT(steps, IsOk());
  EXPECT_THAT(steps->complete, ElementsAre(3));
}

}  // namespace
}  // namespace tether::internal
