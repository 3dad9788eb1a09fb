#include "core/internal/receive_buffers.h"

#include <absl/base/thread_annotations.h>
#include <absl/synchronization/mutex.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "core/internal/huge_page_memory.h"

namespace tether::internal {
namespace {

struct Buffer {
  void* data;
  size_t nbytes;
};

class Cache {
 public:
  // An idle buffer of exactly `nbytes`, or a new one.
  Buffer take(size_t nbytes) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      auto it = idle_.find(nbytes);
      if (it != idle_.end()) {
        Buffer buffer = it->second;
        idle_.erase(it);
        idle_bytes_ -= nbytes;
        ++reused_;
        return buffer;
      }
      ++allocated_;
    }
    void* data = allocate_on_huge_pages(nbytes);
    if (data == nullptr) {
      TORCH_CHECK(false, "cannot allocate a receive buffer of ", nbytes,
                  " bytes");
    }
    return Buffer{data, nbytes};
  }

  // Keeps `buffer` when there is room: the oldest idle buffers of other
  // sizes make way for it, so the cache follows the sizes in use.
  void give_back(Buffer buffer) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<void*> freed;
    {
      absl::MutexLock lock(&mu_);
      if (buffer.nbytes > kReceiveCacheBytes) {
        freed.push_back(buffer.data);
      } else {
        while (idle_bytes_ + buffer.nbytes > kReceiveCacheBytes) {
          auto victim = idle_.begin();
          idle_bytes_ -= victim->second.nbytes;
          freed.push_back(victim->second.data);
          idle_.erase(victim);
        }
        idle_.emplace(buffer.nbytes, buffer);
        idle_bytes_ += buffer.nbytes;
      }
    }
    for (void* data : freed) std::free(data);
  }

  ReceiveBufferStats stats() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return ReceiveBufferStats{reused_, allocated_, idle_bytes_};
  }

  void drop_idle() ABSL_LOCKS_EXCLUDED(mu_) {
    std::multimap<size_t, Buffer> idle;
    {
      absl::MutexLock lock(&mu_);
      idle.swap(idle_);
      idle_bytes_ = 0;
    }
    for (auto& [size, buffer] : idle) std::free(buffer.data);
  }

 private:
  absl::Mutex mu_;
  std::multimap<size_t, Buffer> idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
};

// Never destroyed: storages may be released during static destruction.
Cache& cache() {
  static Cache* const instance = new Cache();
  return *instance;
}

// The DataPtr's deleter: the context is the heap-allocated Buffer.
void give_back(void* context) {
  auto* buffer = static_cast<Buffer*>(context);
  cache().give_back(*buffer);
  delete buffer;
}

}  // namespace

c10::Storage receive_storage(size_t nbytes) {
  if (nbytes < kReusedBufferBytes) {
    return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                        c10::GetCPUAllocator(), /*resizable=*/false);
  }
  auto* buffer = new Buffer(cache().take(nbytes));
  c10::DataPtr data(buffer->data, buffer, &give_back,
                    c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                      std::move(data), /*allocator=*/nullptr,
                      /*resizable=*/false);
}

ReceiveBufferStats receive_buffer_stats() { return cache().stats(); }

void drop_idle_receive_buffers() { cache().drop_idle(); }

}  // namespace tether::internal
