#include "core/toolkit/receive_buffers.h"

#include <absl/base/thread_annotations.h>
#include <absl/synchronization/mutex.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "core/toolkit/huge_page_memory.h"

namespace tether::internal {
namespace {

struct Buffer {
  void* data;
  size_t nbytes;
};

// Whole pages: a writable buffer's quarantine remaps them all.
size_t whole_pages(size_t nbytes) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (nbytes + page - 1) / page * page;
}

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
    // Whole pages (it starts at a huge page's boundary): nothing of the
    // allocator's own shares a page with it.
    void* data = allocate_on_huge_pages(whole_pages(nbytes));
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

  // Never reused or freed: its pages become an inaccessible reservation.
  void quarantine(Buffer buffer) ABSL_LOCKS_EXCLUDED(mu_) {
    void* reserved = ::mmap(buffer.data, whole_pages(buffer.nbytes), PROT_NONE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
                                MAP_NORESERVE,
                            -1, 0);
    // Should the kernel refuse, the buffer is kept as it is (leaked, never
    // reused): a late write lands in memory nothing else uses.
    (void)reserved;
    absl::MutexLock lock(&mu_);
    ++quarantined_;
  }

  ReceiveBufferStats stats() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return ReceiveBufferStats{reused_, allocated_, idle_bytes_, quarantined_};
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
  int64_t quarantined_ ABSL_GUARDED_BY(mu_) = 0;
};

// Never destroyed: storages may be released during static destruction.
Cache& cache() {
  static Cache* const instance = new Cache();
  return *instance;
}

// A storage's hold on its buffer: the DataPtr's context.
struct Held {
  Buffer buffer;
  std::atomic<bool> quarantined{false};
};

// The DataPtr's deleter.
void give_back(void* context) {
  auto* held = static_cast<Held*>(context);
  if (held->quarantined.load(std::memory_order_acquire)) {
    cache().quarantine(held->buffer);
  } else {
    cache().give_back(held->buffer);
  }
  delete held;
}

c10::Storage cached_storage(size_t nbytes) {
  auto* held = new Held{cache().take(nbytes)};
  c10::DataPtr data(held->buffer.data, held, &give_back,
                    c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                      std::move(data), /*allocator=*/nullptr,
                      /*resizable=*/false);
}

}  // namespace

c10::Storage receive_storage(size_t nbytes) {
  if (nbytes < kReusedBufferBytes) {
    return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                        c10::GetCPUAllocator(), /*resizable=*/false);
  }
  return cached_storage(nbytes);
}

c10::Storage writable_receive_storage(size_t nbytes) {
  if (nbytes == 0) return receive_storage(0);
  return cached_storage(nbytes);
}

void quarantine_receive_storage(const c10::Storage& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get_deleter() != &give_back) return;
  static_cast<Held*>(data.get_context())
      ->quarantined.store(true, std::memory_order_release);
}

ReceiveBufferStats receive_buffer_stats() { return cache().stats(); }

void drop_idle_receive_buffers() { cache().drop_idle(); }

}  // namespace tether::internal
