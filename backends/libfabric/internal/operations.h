// The operations a libfabric agent hands to libfabric and the messages they
// serve (internal to the libfabric backend): an Op per posted buffer or
// chunk, a Transfer per message lent by rendezvous, an Arrival per message
// being pulled, the frames waiting to go.
//
// Thread safety: none; the agent's progress thread alone uses them (and
// its creating thread before that thread runs).
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_OPERATIONS_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_OPERATIONS_H_

#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <absl/status/status.h>

#include "backends/libfabric/internal/fabric.h"
#include "backends/libfabric/internal/framing.h"
#include "backends/libfabric/internal/mr_cache.h"
#include "core/message.h"

namespace tether::backends::libfabric::internal {

struct Op;

// What libfabric gets as an operation's context: its scratch space, then
// the operation it belongs to.
struct OpContext {
  fi_context2 scratch;
  Op* op;
};

enum class OpKind {
  kEagerReceive,  // a pre-posted buffer of the pool
  kEagerSend,     // a frame from a send buffer
  kRead,          // a chunk pulled with fi_read
  kBulkReceive,   // a chunk pulled by a tagged receive
  kBulkSend,      // a chunk sent on a peer's clear-to-send
};

struct Arrival;
struct Transfer;

struct Op {
  Op() { context.op = this; }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  OpContext context;
  OpKind kind = OpKind::kEagerSend;
  int rank = -1;
  // The local buffer: a pool slot, a send buffer, a chunk's place.
  char* buffer = nullptr;
  size_t length = 0;
  void* desc = nullptr;
  // Eager buffers: the slot's index.
  size_t slot = 0;
  uint64_t remote_address = 0;
  uint64_t key = 0;
  uint64_t tag = 0;
  // Pulls: the message they fill; bulk sends: the transfer they read.
  std::shared_ptr<Arrival> incoming;
  std::shared_ptr<Transfer> transfer;
};

// A message the sender lends by rendezvous: kept, with its registrations,
// until the receiver releases it.
struct Transfer {
  uint64_t id = 0;
  int rank = -1;
  // Declared before the message, so destroyed after it: released, a
  // storage's registration sees whether anyone else still holds it.
  std::vector<MrCache::Handle> storage_regions;
  Message message;
  std::string body;  // the encoded body, when it is remote
  std::unique_ptr<MemoryRegion> body_region;
  std::unique_ptr<MemoryRegion> payload_region;
  // Per segment, where its bytes are and their descriptor (remote ones).
  std::vector<const char*> segment_data;
  std::vector<void*> segment_desc;
  // Tagged mode: the chunks the receiver asks for, and their tags' base.
  std::vector<Chunk> chunks;
  uint64_t sequence_base = 0;
};

// A message being received: its remote parts being pulled.
struct Arrival {
  int rank = -1;
  FrameKind kind = FrameKind::kRequest;
  MessageHead head;
  uint64_t transfer = 0;
  uint64_t sequence_base = 0;
  uint64_t chunk_size = 0;
  // Pulling the remote body first, then the segments it lists.
  bool pulling_body = false;
  std::string body;
  std::unique_ptr<MemoryRegion> body_region;
  std::vector<SegmentDesc> segments;
  std::vector<std::unique_ptr<MemoryRegion>> segment_regions;
  Message message;
  std::vector<Chunk> chunks;
  size_t next_chunk = 0;  // the next to issue
  size_t announced = 0;   // tagged mode: chunks the sender was told to send
  size_t completed = 0;
  int outstanding = 0;
  absl::Status error;
  // The peer was lost: nothing more is done for this message.
  bool abandoned = false;
};

// A frame waiting for a credit, a send buffer or room on the endpoint.
struct OutFrame {
  FrameHeader header;  // credits and the slot return are set when it goes
  std::string tail;    // what follows the header
};

// A range of chunks a peer asked for (tagged mode).
struct SendRange {
  std::shared_ptr<Transfer> transfer;
  size_t next = 0;
  size_t end = 0;
};

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_OPERATIONS_H_
