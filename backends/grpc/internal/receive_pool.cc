#include "backends/grpc/internal/receive_pool.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>

namespace tether::backends::grpc_internal {

// In front of each pooled block's bytes; kHeaderBytes keeps the bytes
// 64-byte aligned, as LibTorch's CPU allocator does.
struct ReceivePool::Header {
  const ReceivePool* pool;
  size_t capacity;
};

namespace {

constexpr size_t kHeaderBytes = 64;
constexpr size_t kPage = 4096;

}  // namespace

ReceivePool& ReceivePool::get() {
  // WARNING: never destroyed: received storages may be freed at any time,
  // static destruction included.
  static ReceivePool* pool = new ReceivePool(kMinPooledBytes, kMaxCachedBytes);
  return *pool;
}

ReceivePool::~ReceivePool() {
  absl::MutexLock lock(&mu_);
  for (auto& [capacity, blocks] : free_) {
    for (void* block : blocks) std::free(block);
  }
}

c10::DataPtr ReceivePool::allocate(size_t bytes) const {
  if (bytes < min_pooled_bytes_) {
    return c10::GetCPUAllocator()->allocate(bytes);
  }
  const size_t capacity = (bytes + kPage - 1) / kPage * kPage;
  void* block = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(capacity);
    if (it != free_.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
      cached_ -= capacity;
    }
  }
  if (block == nullptr) {
    if (::posix_memalign(&block, kHeaderBytes, kHeaderBytes + capacity) != 0) {
      block = nullptr;
    }
    TORCH_CHECK(block != nullptr, "the gRPC agent cannot allocate ", bytes,
                " bytes for a received storage");
    auto* header = static_cast<Header*>(block);
    header->pool = this;
    header->capacity = capacity;
  }
  return c10::DataPtr(static_cast<char*>(block) + kHeaderBytes, block,
                      &ReceivePool::give_back, c10::Device(c10::kCPU));
}

void ReceivePool::give_back(void* block) {
  const auto* header = static_cast<const Header*>(block);
  const ReceivePool& pool = *header->pool;
  {
    absl::MutexLock lock(&pool.mu_);
    if (pool.cached_ + header->capacity <= pool.max_cached_bytes_) {
      pool.cached_ += header->capacity;
      pool.free_[header->capacity].push_back(block);
      return;
    }
  }
  std::free(block);
}

size_t ReceivePool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_;
}

}  // namespace tether::backends::grpc_internal
