// Memory on transparent huge pages, for the buffers and tensors that are
// large enough to fill them (core/toolkit/receive_buffers.h,
// core/huge_pages.h).
//
// Thread safety: may be called from any thread.
#ifndef TETHER_CORE_TOOLKIT_HUGE_PAGE_MEMORY_H_
#define TETHER_CORE_TOOLKIT_HUGE_PAGE_MEMORY_H_

#include <cstddef>

namespace tether::internal {

// Transparent huge pages are 2 MiB on x86-64 and arm64 with 4 KiB pages.
constexpr size_t kHugePage = size_t{2} << 20;

// `nbytes` aligned to kHugePage and advised to use transparent huge pages
// (advice only: where the kernel has them off, it does nothing), to be
// released with std::free; nullptr when memory runs out.
void* allocate_on_huge_pages(size_t nbytes);

}  // namespace tether::internal

#endif  // TETHER_CORE_TOOLKIT_HUGE_PAGE_MEMORY_H_
