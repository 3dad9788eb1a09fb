// DiscardRegion: memory to receive bytes into only to drop them (internal
// to the tensorpipe backend).
//
// TensorPipe reads a message whole into the buffers its receiver gives, and
// a pipe cannot move on to the next message before that read: a message the
// receiver refuses (over AgentSetup::limits) must still be read. A
// DiscardRegion is a range of virtual memory of the message's length whose
// pages all map one small shared buffer (a memfd mapped again and again),
// so the refused bytes land in the same few pages over and over: reading a
// 32 GiB message this way holds 8 MiB of data, never the message. (The page
// tables of the range still cost about 2 MiB per GiB while it is mapped,
// and each mapped page counts in the process's RSS, as shared memory does.)
//
// Linux only (memfd_create); the region must not be read, only written.
//
// Ownership: the region is unmapped when the object is destroyed; keep it
// alive until the read into it has completed.
//
// Thread safety: thread-compatible; writes into the region may come from any
// thread (they alias each other, which is fine for bytes nobody reads).
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_DISCARD_REGION_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_DISCARD_REGION_H_

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tether::backends::tensorpipe::internal {

class DiscardRegion {
 public:
  // The largest region: more than any message a peer within the default
  // limits (64 GiB of tensors) can send. A peer announcing more is broken
  // or hostile, and loses its connection instead.
  static constexpr uint64_t kMaxLength = uint64_t{1} << 37;
  // At most this many mappings make up one region; the shared buffer grows
  // (from 1 MiB) with the region to stay within it.
  static constexpr uint64_t kMaxMappings = 4096;

  // A region of `length` bytes (0 < length <= kMaxLength). RESOURCE_EXHAUSTED
  // when the system refuses the memory or the mappings, or the length is
  // over kMaxLength.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DiscardRegion>> create(
      uint64_t length);

  ~DiscardRegion();
  DiscardRegion(const DiscardRegion&) = delete;
  DiscardRegion& operator=(const DiscardRegion&) = delete;

  char* data() const { return base_; }
  uint64_t length() const { return length_; }
  // The physical memory behind the region, in bytes.
  uint64_t buffer_bytes() const { return buffer_; }

  // After a read into the region failed while another process may still
  // write into it (the cma_write channel): its pages become an
  // inaccessible reservation, which the destructor keeps, so that the
  // addresses are never mapped again and a late write fails instead of
  // landing. The memory goes back to the kernel.
  void quarantine();

 private:
  DiscardRegion(char* base, uint64_t reserved, uint64_t length,
                uint64_t buffer)
      : base_(base), reserved_(reserved), length_(length), buffer_(buffer) {}

  char* const base_;
  const uint64_t reserved_;
  const uint64_t length_;
  const uint64_t buffer_;
  bool quarantined_ = false;
};

}  // namespace tether::backends::tensorpipe::internal

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_DISCARD_REGION_H_
