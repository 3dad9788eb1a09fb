#include "backends/tensorpipe/internal/discard_region.h"

#include <gtest/gtest.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "testing/status_matchers.h"

namespace tether::backends::tensorpipe::internal {
namespace {

using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

TEST(DiscardRegion, TakesWritesOverItsWholeLengthInABoundedBuffer) {
  constexpr uint64_t kLength = (uint64_t{1} << 30) + 12345;  // 1 GiB and more
  absl::StatusOr<std::unique_ptr<DiscardRegion>> region =
      DiscardRegion::create(kLength);
  ASSERT_THAT(region, IsOk());
  EXPECT_EQ((*region)->length(), kLength);
  EXPECT_EQ((*region)->buffer_bytes(), uint64_t{1} << 20);
  // Every byte is writable, and the writes land in the same 1 MiB: what is
  // written at one offset reads back at every offset a buffer away.
  char* data = (*region)->data();
  for (uint64_t at = 0; at < kLength; at += 4096) data[at] = 'x';
  data[7] = 'a';
  const uint64_t buffer = (*region)->buffer_bytes();
  for (uint64_t at = 7; at < kLength; at += buffer) {
    ASSERT_EQ(data[at], 'a') << "at " << at;
  }
  std::memset(data + kLength - 1000, 'y', 1000);
}

// A write that comes after the read failed (another process granted the
// region) fails instead of landing, and the addresses stay reserved.
TEST(DiscardRegion, AQuarantinedRegionTakesNoMoreWrites) {
  absl::StatusOr<std::unique_ptr<DiscardRegion>> region =
      DiscardRegion::create(3 << 20);
  ASSERT_THAT(region, IsOk());
  char* data = (*region)->data();
  data[0] = 'x';
  (*region)->quarantine();
  region->reset();
  char bytes[16] = {};
  iovec local{bytes, sizeof bytes};
  iovec remote{data + (1 << 20), sizeof bytes};
  errno = 0;
  EXPECT_EQ(::process_vm_writev(::getpid(), &local, 1, &remote, 1, 0), -1);
  EXPECT_EQ(errno, EFAULT);
}

TEST(DiscardRegion, BufferGrowsToKeepTheMappingsBounded) {
  constexpr uint64_t kLength = uint64_t{16} << 30;
  absl::StatusOr<std::unique_ptr<DiscardRegion>> region =
      DiscardRegion::create(kLength);
  ASSERT_THAT(region, IsOk());
  EXPECT_EQ((*region)->buffer_bytes(), uint64_t{4} << 20);
}

TEST(DiscardRegion, RefusesEmptyAndHugeLengths) {
  EXPECT_THAT(DiscardRegion::create(0),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(DiscardRegion::create(DiscardRegion::kMaxLength + 1),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

}  // namespace
}  // namespace tether::backends::tensorpipe::internal
