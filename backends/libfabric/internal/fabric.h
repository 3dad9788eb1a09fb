// Fabric: the libfabric objects of one agent, and the provider look-ups
// (internal to the libfabric backend).
//
// One Fabric is a fabric, a domain, a completion queue, an address vector
// (FI_AV_TABLE) and one FI_EP_RDM endpoint bound to both, opened for a
// provider named as libfabric names them ("tcp;ofi_rxm", "shm",
// "verbs;ofi_rxm", "efa"). The endpoint sends and receives tagged messages
// and, where the provider has FI_RMA, serves and issues fi_read. The
// completion queue has a file descriptor to sleep on where the provider
// offers one (FI_WAIT_FD: tcp;ofi_rxm here); elsewhere (shm) it is polled.
//
// libfabric itself is opened on first use (fabric_library.h): nothing here
// needs it linked, and opening an endpoint keeps the process's signal
// dispositions (kept_signals.h).
//
// Ownership: a Fabric owns its libfabric objects and closes them in order
// (endpoint, address vector, completion queue, domain, fabric). Memory
// regions it registers (MemoryRegion) must be destroyed before it.
//
// Thread safety: none. The domain is opened with FI_THREAD_DOMAIN: the agent
// calls a Fabric, and everything it registered, from its progress thread
// only (probe() and rdm_providers() excepted: they touch no Fabric).
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_FABRIC_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_FABRIC_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/libfabric/internal/fabric_library.h"

namespace tether::backends::libfabric::internal {

// What an agent asks of libfabric.
struct FabricOptions {
  // fi_info's provider name, e.g. "tcp;ofi_rxm". Required.
  std::string provider;
  // Where an IP-addressed provider binds: an IP literal, passed as the node
  // with FI_SOURCE. Ignored by providers not addressed by IP (shm). Empty:
  // the provider's choice.
  std::string address;
  // When the provider cannot bind to `address`: an error if true, else the
  // provider's choice (for a default address that RDMA NICs may not have).
  bool address_required = false;
  // Ask for FI_RMA; without it (or when the provider lacks it) the endpoint
  // moves large buffers by tagged messages only.
  bool want_rma = true;
};

// libfabric's text for error number `error` (positive, as fi_errno.h) with
// the number: "Connection refused (111)".
std::string fi_error_text(int error);

// The FI_EP_RDM providers libfabric offers on this machine, by name, sorted
// (none when libfabric cannot be loaded).
std::vector<std::string> rdm_providers();

// OK if `provider` offers FI_EP_RDM endpoints with tagged messages here;
// otherwise FAILED_PRECONDITION naming it, libfabric's reason and the
// providers that are available, or naming libfabric.so.1 when it cannot be
// loaded (fabric_library.h).
[[nodiscard]] absl::Status probe(const std::string& provider);

// A registered buffer. Destroy before the Fabric that made it.
class MemoryRegion {
 public:
  MemoryRegion(fid_mr* mr, const char* base, size_t length, bool virt_addr);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  // The local descriptor for data transfers from or into this region.
  void* desc() const;
  // The key a peer passes to fi_read.
  uint64_t key() const;
  // The address a peer passes to fi_read for `p` (inside this region): the
  // virtual address, or the offset from the region's start, as the
  // provider's FI_MR_VIRT_ADDR says.
  uint64_t remote_address(const void* p) const;
  const char* base() const { return base_; }
  size_t length() const { return length_; }

 private:
  fid_mr* const mr_;
  const char* const base_;
  const size_t length_;
  const bool virt_addr_;
};

class Fabric {
 public:
  // Opens the objects for `options`, the completion queue sized for the
  // provider's transmit and receive queues, with every signal disposition
  // kept (kept_signals.h: the shm provider installs handlers at its first
  // endpoint). Errors: FAILED_PRECONDITION when libfabric cannot be loaded
  // or the provider is absent here (naming it and the available ones),
  // INVALID_ARGUMENT when a required address is unusable, UNAVAILABLE when
  // libfabric fails to open an object (naming the call).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Fabric>> open(
      const FabricOptions& options, size_t av_count);

  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  fid_ep* ep() const { return ep_; }
  fid_cq* cq() const { return cq_; }
  fid_fabric* fabric() const { return fabric_; }
  const fi_info& info() const { return *info_; }

  // The provider's name as libfabric reports it (e.g. "tcp;ofi_rxm").
  std::string provider_name() const;
  bool has_rma() const;
  // Sizes of the endpoint's transmit and receive queues.
  size_t tx_size() const;
  size_t rx_size() const;
  // The largest message the endpoint sends in one step, with no completion
  // to wait for on the receiver (fi_inject).
  size_t inject_size() const;
  // The largest message or read the endpoint takes.
  uint64_t max_message_size() const;
  // The file descriptor that becomes readable when the completion queue
  // may have entries (call fi_trywait first), or -1: poll instead.
  int wait_fd() const { return wait_fd_; }

  // This endpoint's address, as peers insert it (fi_getname).
  [[nodiscard]] absl::StatusOr<std::string> name() const;

  // Inserts peer addresses in order; their fi_addr_t, in the same order.
  [[nodiscard]] absl::StatusOr<std::vector<fi_addr_t>> insert(
      const std::vector<std::string>& names);

  // Takes a peer's address out of the address vector (a worker that left
  // a dynamic group). UNAVAILABLE with libfabric's reason on failure.
  [[nodiscard]] absl::Status remove(fi_addr_t address);

  // Closes the endpoint (idempotent): its posted receives and operations
  // in flight are abandoned, so their buffers may be freed afterwards.
  void close_endpoint();

  // Registers [p, p + length) with `access` (FI_SEND, FI_RECV, FI_READ,
  // FI_REMOTE_READ). UNAVAILABLE with libfabric's reason on failure.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<MemoryRegion>> register_memory(
      const void* p, size_t length, uint64_t access);

 private:
  explicit Fabric(const FabricLibrary& library) : library_(library) {}

  const FabricLibrary& library_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  int wait_fd_ = -1;
  // Keys we choose when the provider does not (no FI_MR_PROV_KEY).
  uint64_t next_key_ = 1;
};

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_FABRIC_H_
