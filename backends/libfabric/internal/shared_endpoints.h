// The libfabric objects of agents that have shut down, and the shm
// endpoints of this process that must outlive them (internal to the
// libfabric backend; the comment on SharedEndpoints says why).
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_SHARED_ENDPOINTS_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_SHARED_ENDPOINTS_H_

#include <absl/base/thread_annotations.h>
#include <absl/synchronization/mutex.h>

#include <memory>
#include <utility>
#include <vector>

#include "backends/libfabric/internal/fabric.h"
#include "backends/libfabric/internal/operations.h"

namespace tether::backends::libfabric::internal {

// The libfabric objects and buffers of an agent that has shut down.
struct ClosedEndpoint {
  // Closes the endpoint first, then what it may have used.
  void close() {
    if (fabric != nullptr) fabric->close_endpoint();
    receive_ops.clear();
    send_ops.clear();
    receive_regions.clear();
    send_region.reset();
    receive_slabs.clear();
    send_slab.clear();
    fabric.reset();
  }

  std::vector<std::unique_ptr<Op>> receive_ops;
  std::vector<std::unique_ptr<Op>> send_ops;
  std::vector<std::unique_ptr<MemoryRegion>> receive_regions;
  std::unique_ptr<MemoryRegion> send_region;
  std::vector<std::vector<char>> receive_slabs;
  std::vector<char> send_slab;
  std::unique_ptr<Fabric> fabric;
};

// The shm endpoints of this process. libfabric 1.17's shm provider lets
// endpoints of one process use each other's memory region directly, and
// closing an endpoint unmaps its region: a send to it (or a completion
// written back to it) from another endpoint of the process then crashes.
// So an shm endpoint that shuts down while another one of the process is
// open stays open, idle, and closes with the last one: what is sent to it
// meanwhile is never read, as if it had gone. Processes with one worker,
// the usual case, are not affected. Thread-safe.
class SharedEndpoints {
 public:
  static SharedEndpoints& get() {
    static auto* endpoints = new SharedEndpoints();  // never destroyed
    return *endpoints;
  }

  void opened() {
    absl::MutexLock lock(&mu_);
    ++open_;
  }

  // Whether an shm endpoint other than the caller's is open.
  bool others_open() {
    absl::MutexLock lock(&mu_);
    return open_ > 1;
  }

  // The caller's endpoint (counted by opened()) shuts down: parked while
  // others are open, else closed with every parked one.
  void close(std::unique_ptr<ClosedEndpoint> endpoint) {
    std::vector<std::unique_ptr<ClosedEndpoint>> closing;
    {
      absl::MutexLock lock(&mu_);
      if (--open_ > 0) {
        parked_.push_back(std::move(endpoint));
        return;
      }
      closing.swap(parked_);
    }
    closing.push_back(std::move(endpoint));
    for (auto& closed : closing) closed->close();
  }

 private:
  absl::Mutex mu_;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<ClosedEndpoint>> parked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_SHARED_ENDPOINTS_H_
