// A message's context metadata, which the codec (core/wire/codec.h)
// carries in the envelope (core/wire/wire.proto, Envelope.autograd) for a
// layer above that gives it meaning through a ContextHook
// (core/worker_extension.h). Kept in core because the envelope encodes it.
#ifndef TETHER_CORE_WIRE_CONTEXT_META_H_
#define TETHER_CORE_WIRE_CONTEXT_META_H_

#include <cstdint>

namespace tether::wire {

// A message's place in a context of a layer above (ContextHook,
// core/worker_extension.h; distributed autograd gives it meaning): the
// context it belongs to, the id pairing the sender's send node with the
// receiver's recv node (-1 when the message carries no tensor that requires
// grad), and the sending worker's id. context_id -1: not in a context.
struct ContextMeta {
  int64_t context_id = -1;
  int64_t message_id = -1;
  int32_t from = -1;

  bool in_context() const { return context_id >= 0; }
};

}  // namespace tether::wire

#endif  // TETHER_CORE_WIRE_CONTEXT_META_H_
