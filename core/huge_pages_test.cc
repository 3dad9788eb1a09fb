#include "core/huge_pages.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace tether {
namespace {

constexpr int64_t kHugePage = int64_t{2} << 20;

bool aligned(const void* data, int64_t to) {
  return reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(to) == 0;
}

// "THPeligible" of the mapping that holds `data` in /proc/self/smaps: 1
// when the kernel may back it with huge pages (our advice took), 0 if not,
// -1 when there is no such line.
int huge_page_eligible(const void* data) {
  std::ifstream smaps("/proc/self/smaps");
  const auto address = reinterpret_cast<uintptr_t>(data);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> start >> dash >> end && dash == '-' &&
        line.find(':') > line.find(' ')) {
      inside = start <= address && address < end;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

bool kernel_has_huge_pages() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(enabled, modes);
  return !modes.empty() && modes.find("[never]") == std::string::npos;
}

// One test, in order: the allocator is process-wide and stays installed.
TEST(HugePages, TheEnvironmentAsksAndLargeTensorsGoOnHugePages) {
  at::Tensor before = at::ones({5 << 20}, at::kByte);  // the default's

  ::unsetenv("THP_MEM_ALLOC_ENABLE");
  EXPECT_TRUE(use_huge_pages_if_asked().ok());
  ::setenv("THP_MEM_ALLOC_ENABLE", "0", 1);
  EXPECT_TRUE(use_huge_pages_if_asked().ok());
  EXPECT_FALSE(using_huge_pages_for_large_tensors());

  ::setenv("THP_MEM_ALLOC_ENABLE", "yes", 1);
  absl::Status bad = use_huge_pages_if_asked();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("THP_MEM_ALLOC_ENABLE"), std::string::npos);
  EXPECT_NE(bad.message().find("'yes'"), std::string::npos);
  EXPECT_FALSE(using_huge_pages_for_large_tensors());

  ::setenv("THP_MEM_ALLOC_ENABLE", "1", 1);
  ASSERT_TRUE(use_huge_pages_if_asked().ok());
  EXPECT_TRUE(using_huge_pages_for_large_tensors());
  EXPECT_TRUE(use_huge_pages_for_large_tensors().ok());  // idempotent
  ::unsetenv("THP_MEM_ALLOC_ENABLE");

  // A large tensor: aligned to a huge page, advised, and an ordinary tensor.
  at::Tensor large = at::ones({4 << 20}, at::kByte);
  EXPECT_TRUE(aligned(large.data_ptr(), kHugePage));
  EXPECT_EQ(large.sum().item<int64_t>(), int64_t{4} << 20);
  if (kernel_has_huge_pages()) {
    EXPECT_EQ(huge_page_eligible(large.data_ptr()), 1);
  }
  at::Tensor exact = at::empty({kHugePage}, at::kByte);
  EXPECT_TRUE(aligned(exact.data_ptr(), kHugePage));

  // Below a huge page: LibTorch's allocation as before (64-byte aligned).
  at::Tensor small = at::full({1000}, 3.0);
  EXPECT_TRUE(aligned(small.data_ptr(), 64));
  EXPECT_EQ(small.sum().item<double>(), 3000.0);
  at::Tensor none = at::empty({0});
  EXPECT_EQ(none.numel(), 0);

  // One raw deleter for both sizes, as LibTorch's own allocator has.
  c10::Allocator* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  void* raw_large = allocator->raw_allocate(3 << 20);
  EXPECT_TRUE(aligned(raw_large, kHugePage));
  allocator->raw_deallocate(raw_large);
  allocator->raw_deallocate(allocator->raw_allocate(100));

  // A tensor from before keeps its memory and its own deleter.
  EXPECT_EQ(before.sum().item<int64_t>(), int64_t{5} << 20);
  before = at::Tensor();
}

}  // namespace
}  // namespace tether
