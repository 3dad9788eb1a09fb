// Memory for the large storages the gRPC agent receives (internal to the
// gRPC backend).
//
// Why: gRPC hands a received message over as its own slices of at most
// 64 KiB (measured with 1 MiB chunks: 17 to 19 slices each), so a
// storage larger than that cannot adopt them and its bytes are copied into
// a contiguous block. Copying 16 MiB takes ~2 ms on the project's machine;
// the page faults of a fresh 16 MiB block take 10 to 16 ms more
// (docs/benchmarks.md). The pool keeps the blocks of freed storages and
// hands them out again, already faulted in, for storages of the same size
// (page-rounded): training sends the same shapes every step.
//
// Blocks under kMinPooledBytes (4 MiB: below it no gain was measured, and
// glibc reuses freed memory well) come from LibTorch's CPU allocator as
// usual.
// At most kMaxCachedBytes are kept, process-wide; a block given back past
// that is freed.
//
// Ownership: a storage's DataPtr owns its block; its deleter gives it back.
// The pool is never destroyed (storages may outlive every agent), so the
// allocator pointer a storage keeps stays valid.
//
// Thread safety: allocate() and the deleters may run on any thread.
#ifndef TETHER_BACKENDS_GRPC_INTERNAL_RECEIVE_POOL_H_
#define TETHER_BACKENDS_GRPC_INTERNAL_RECEIVE_POOL_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/synchronization/mutex.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <vector>

namespace tether::backends::grpc_internal {

inline constexpr size_t kMinPooledBytes = 4 << 20;
inline constexpr size_t kMaxCachedBytes = size_t{256} << 20;

class ReceivePool final : public c10::Allocator {
 public:
  // The process's pool.
  static ReceivePool& get();

  ReceivePool(size_t min_pooled_bytes, size_t max_cached_bytes)
      : min_pooled_bytes_(min_pooled_bytes),
        max_cached_bytes_(max_cached_bytes) {}
  // Frees the cached blocks; only for pools whose storages are all gone.
  ~ReceivePool() override;

  // Throws c10::Error when out of memory, as LibTorch's allocators do.
  c10::DataPtr allocate(size_t bytes) const override;

  // Bytes kept for reuse now.
  size_t cached_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Header;
  static void give_back(void* block);

  const size_t min_pooled_bytes_;
  const size_t max_cached_bytes_;
  mutable absl::Mutex mu_;
  // Free blocks by capacity.
  mutable absl::flat_hash_map<size_t, std::vector<void*>> free_
      ABSL_GUARDED_BY(mu_);
  mutable size_t cached_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tether::backends::grpc_internal

#endif  // TETHER_BACKENDS_GRPC_INTERNAL_RECEIVE_POOL_H_
