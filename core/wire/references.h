// How the codec (core/wire/codec.h) carries references (c10 RRefs): their
// wire form (RRefForkData) and the hook through which the layer that gives
// them meaning forks and adopts them (ReferenceHook, given by a
// WorkerExtension, core/worker_extension.h). Kept in core because the
// envelope (core/wire/wire.proto, Value.rref) encodes these fields: the
// codec moves them, the layer above gives them meaning.
#ifndef TETHER_CORE_WIRE_REFERENCES_H_
#define TETHER_CORE_WIRE_REFERENCES_H_

#include <ATen/core/ivalue.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace tether::wire {

// An RRef's wire form. The codec moves it; the RRef layer gives it meaning.
struct RRefForkData {
  int32_t owner = -1;
  // The RRef's global id: the worker that created it and a local number.
  int32_t rref_worker = -1;
  int64_t rref_local = -1;
  // The id of the fork (user reference) this message creates.
  int32_t fork_worker = -1;
  int64_t fork_local = -1;
  // The worker that sent (forked) it.
  int32_t parent = -1;
  // The type of the referenced value.
  c10::TypePtr type;
};

// The side of the codec for references (c10 RRefs), given by the layer that
// gives them meaning (WorkerExtension::reference_hook; core/wire knows no
// protocol). Called during encode() and decode() on the calling thread.
class ReferenceHook {
 public:
  virtual ~ReferenceHook() = default;
  // An RRef leaving in a message: records the fork and returns its form.
  [[nodiscard]] virtual absl::StatusOr<RRefForkData> fork(
      const c10::intrusive_ptr<c10::RRefInterface>& rref) = 0;
  // An RRef arriving in a message: the local reference it becomes.
  [[nodiscard]] virtual absl::StatusOr<c10::intrusive_ptr<c10::RRefInterface>>
  adopt(const RRefForkData& data) = 0;
};

}  // namespace tether::wire

#endif  // TETHER_CORE_WIRE_REFERENCES_H_
