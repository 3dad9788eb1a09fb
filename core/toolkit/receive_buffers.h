// Receive buffers for large incoming tensors, reused.
//
// A backend that receives a tensor into a fresh storage pays for the pages
// of that storage: a buffer as large as 64 MiB is mapped fresh from the
// kernel on every allocation, and every one of its pages faults in (and is
// zeroed) on first write, which on the project's machines costs more than
// the copy itself: a 64 MiB echo into fresh storages ran at a fifth to a
// half of the speed of one into reused buffers. The
// backends (tensorpipe, grpc, libfabric) ask for their large receive
// storages here: a storage comes from a small, bounded cache of buffers by
// size, and goes back to it when its last user (the tensor the user holds)
// drops it. A new buffer is aligned and advised to use transparent huge
// pages, so even a miss faults once per 2 MiB rather than once per 4 KiB.
//
// Ownership: a storage owns its buffer until released; then the cache owns
// it (or frees it when full). The cache is process-wide: storages outlive
// the agents that made them.
//
// Thread safety: every function may be called from any thread; storages
// may be released on any thread.
#ifndef TETHER_CORE_TOOLKIT_RECEIVE_BUFFERS_H_
#define TETHER_CORE_TOOLKIT_RECEIVE_BUFFERS_H_

#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>

namespace tether::internal {

// Storages of at least this many bytes come from the cache.
constexpr size_t kReusedBufferBytes = size_t{2} << 20;

// What the cache holds at most, in bytes of idle buffers.
constexpr size_t kReceiveCacheBytes = size_t{256} << 20;

// A CPU storage of `nbytes` (not resizable), its contents undefined: a
// cached buffer of that size when one is idle, else a new one. Below
// kReusedBufferBytes, an ordinary storage of LibTorch's CPU allocator.
// Throws c10::Error (as LibTorch's allocator does) when memory runs out.
c10::Storage receive_storage(size_t nbytes);

// The same from the cache whatever its size: a storage another process may
// write into (the tensorpipe backend's `cma_write` channel grants its
// address to the sender). Its buffer spans whole pages of its own, so that
// it can be quarantined.
c10::Storage writable_receive_storage(size_t nbytes);

// For a storage of writable_receive_storage() whose receive failed after
// its address may have been granted: a late write may still come. When the
// storage is released, its buffer is not reused or freed: its pages are
// replaced by an inaccessible reservation, so their memory goes back to
// the kernel, the addresses are never handed out again, and a late write
// fails (EFAULT in the writer) instead of landing in another tensor.
// Nothing for any other storage.
void quarantine_receive_storage(const c10::Storage& storage);

struct ReceiveBufferStats {
  int64_t reused = 0;     // storages served from the cache
  int64_t allocated = 0;  // new buffers (large or writable ones)
  size_t idle_bytes = 0;  // bytes the cache holds now
  int64_t quarantined = 0;  // buffers released into quarantine
};
ReceiveBufferStats receive_buffer_stats();

// Frees every idle buffer (tests; a process that wants its memory back).
void drop_idle_receive_buffers();

}  // namespace tether::internal

#endif  // TETHER_CORE_TOOLKIT_RECEIVE_BUFFERS_H_
