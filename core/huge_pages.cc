#include "core/huge_pages.h"

#include <absl/base/call_once.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <cstdlib>

#include "core/toolkit/huge_page_memory.h"

namespace tether {
namespace {

// Every allocation, small or large, is released the same way (both come
// from posix_memalign; c10::free_cpu is free): one raw deleter, as
// LibTorch's own CPU allocator has, so raw_allocate/raw_deallocate work.
void report_and_free(void* data) {
  c10::profiledCPUMemoryReporter().Delete(data);
  c10::free_cpu(data);
}

// LibTorch's default CPU allocator (c10::alloc_cpu, reported to the
// profiler), except that allocations of at least a huge page are aligned
// to one and advised to use huge pages.
class HugePageAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) const override {
    void* data = nullptr;
    if (nbytes >= internal::kHugePage) {
      data = internal::allocate_on_huge_pages(nbytes);
      if (data == nullptr) {
        c10::profiledCPUMemoryReporter().OutOfMemory(nbytes);
        TORCH_CHECK(false, "tether's huge-page CPU allocator: not enough "
                    "memory: you tried to allocate ", nbytes, " bytes.");
      }
    } else {
      data = c10::alloc_cpu(nbytes);  // throws when memory runs out
    }
    c10::profiledCPUMemoryReporter().New(data, nbytes);
    return {data, data, &report_and_free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &report_and_free; }
};

// Never destroyed: tensors may be released during static destruction.
HugePageAllocator* allocator() {
  static HugePageAllocator* const instance = new HugePageAllocator();
  return instance;
}

}  // namespace

absl::Status use_huge_pages_for_large_tensors() {
  // Once: c10's allocator table is not synchronised, so it is written at
  // most once from here (priority 0 replaces LibTorch's default, which is
  // registered at 0, and no allocator installed at a higher priority).
  static absl::once_flag once;
  absl::call_once(once, [] { c10::SetCPUAllocator(allocator(), 0); });
  if (!using_huge_pages_for_large_tensors()) {
    return absl::FailedPreconditionError(
        "huge pages for large tensors: another CPU allocator of a higher "
        "priority is installed (c10::SetCPUAllocator); it is kept");
  }
  return absl::OkStatus();
}

absl::Status use_huge_pages_if_asked() {
  const char* value = std::getenv("THP_MEM_ALLOC_ENABLE");
  if (value == nullptr || *value == '\0') return absl::OkStatus();
  int enable = 0;
  if (!absl::SimpleAtoi(value, &enable)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "THP_MEM_ALLOC_ENABLE must be an integer (1 puts tensors of 2 MiB "
        "and more on transparent huge pages, 0 does not), got '",
        value, "'"));
  }
  if (enable == 0) return absl::OkStatus();
  return use_huge_pages_for_large_tensors();
}

bool using_huge_pages_for_large_tensors() {
  return c10::GetCPUAllocator() == allocator();
}

}  // namespace tether
