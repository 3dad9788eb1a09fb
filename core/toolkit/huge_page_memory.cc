#include "core/toolkit/huge_page_memory.h"

#include <sys/mman.h>

#include <cstdlib>

namespace tether::internal {

void* allocate_on_huge_pages(size_t nbytes) {
  void* data = nullptr;
  if (posix_memalign(&data, kHugePage, nbytes) != 0) return nullptr;
  (void)madvise(data, nbytes, MADV_HUGEPAGE);
  return data;
}

}  // namespace tether::internal
