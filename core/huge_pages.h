// Large CPU tensors on transparent huge pages.
//
// A tensor of 64 MiB on 4 KiB pages is 16,384 pages: every copy of it
// walks that many page-table entries, and a copy between processes (the
// tensorpipe backend's `cma` channel, `process_vm_readv`) pins the sender's
// pages one by one first. On 2 MiB transparent huge pages the same tensor
// is 32 pages: on this project's machine the negotiated pair's 64 MiB echo
// ran 1.4x to 2.1x faster with the sender's tensor on them, and memcpy
// itself about 1.35x (docs/decisions.md, "Huge pages for large tensors").
// tether's own receive buffers are on huge pages already
// (core/toolkit/receive_buffers.h); this puts the user's tensors there.
//
// It is what PyTorch 2.1 and later do when THP_MEM_ALLOC_ENABLE=1: every
// allocation of LibTorch's CPU allocator of at least 2 MiB is aligned to
// 2 MiB and advised to use huge pages; smaller ones are as before. The
// LibTorch this project builds on (1.13) lacks it, so tether installs such
// an allocator, when asked: off by default, as in PyTorch, because a huge
// page is backed whole (an allocation of 2 MiB and one byte may take 4 MiB
// of memory).
//
// Thread safety: the functions may be called from any thread, and install
// the allocator once. Process-wide: it changes the allocator LibTorch uses
// for CPU tensors from then on (tensors allocated before keep their memory
// and are freed as before). LibTorch's table of allocators is a plain
// array: install it before other threads allocate tensors, as
// `Worker::create` and `import tether` do early in a program.
#ifndef TETHER_CORE_HUGE_PAGES_H_
#define TETHER_CORE_HUGE_PAGES_H_

#include <absl/status/status.h>

namespace tether {

// Makes LibTorch's CPU allocator place allocations of at least 2 MiB on
// transparent huge pages (advice: where the kernel has them off, it does
// nothing). Idempotent. FAILED_PRECONDITION if another CPU allocator of a
// higher priority (c10::SetCPUAllocator) is in place: that one is kept.
absl::Status use_huge_pages_for_large_tensors();

// The same, when the environment asks for it as it asks PyTorch:
// THP_MEM_ALLOC_ENABLE set to a non-zero integer. OK and nothing done when
// it is unset or 0; INVALID_ARGUMENT naming the value when it is not an
// integer. `Worker::create` (init_rpc) and `import tether` call it.
absl::Status use_huge_pages_if_asked();

// Whether LibTorch's CPU allocator is tether's huge-page one.
bool using_huge_pages_for_large_tensors();

}  // namespace tether

#endif  // TETHER_CORE_HUGE_PAGES_H_
