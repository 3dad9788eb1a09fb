// WorkerExtension: the seam through which a layer above core (e.g. remote
// references, distributed autograd) lives inside a Worker.
//
// Core knows no layer: it names none of their message types, values or
// rewrites. A layer comes in through an ExtensionFactory passed to
// Worker::create, which runs while the Worker is built, before it serves,
// and may, only then:
//   - serve message types of the layer's own (Worker::register_handler):
//     each layer defines its types as MessageType values core does not use
//     and names them with register_message_type_names (core/message.h);
//   - gate the calls whose arguments it must see first (Worker::set_call_gate);
//   - serve names under a prefix (Worker::add_callable_provider).
// The extension it returns may give the Worker, once, the codec's side for
// the references a message carries (reference_hook) and the side of each
// request and response that travels in a context (context_hook). Rewrites
// of the TorchScript graphs tether runs are process-wide, as the operators
// they point at: register_graph_rewrite (core/callables.h).
//
// Thread safety: the hooks are called on whatever thread encodes or decodes
// a message; they must be safe for that.
#ifndef TETHER_CORE_WORKER_EXTENSION_H_
#define TETHER_CORE_WORKER_EXTENSION_H_

#include <ATen/core/ivalue.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "core/agent.h"
#include "core/future.h"
#include "core/message.h"
#include "core/wire/context_meta.h"
#include "core/wire/references.h"

namespace tether {

class Worker;

// The side of every request and response that travels in a context of a
// layer above (a distributed autograd context: wire::ContextMeta). The
// Worker calls it on the thread that encodes or decodes a message.
class ContextHook {
 public:
  virtual ~ContextHook() = default;
  // The context of the calling thread, or -1.
  virtual int64_t current_context() const = 0;
  // Makes `context` (-1: none) current on this thread; returns the previous.
  virtual int64_t exchange_current_context(int64_t context) = 0;
  // `value` leaves for `to` within `context`: records what the layer needs
  // (e.g. a send node for the tensors that require grad) and returns the
  // metadata the message carries.
  [[nodiscard]] virtual absl::StatusOr<wire::ContextMeta> on_send(
      int64_t context, const WorkerInfo& to, const c10::IValue& value) = 0;
  // `value` arrived with `meta` (in a context): e.g. gives its tensors that
  // require grad a recv node as their grad_fn.
  [[nodiscard]] virtual absl::Status on_receive(const wire::ContextMeta& meta,
                                                c10::IValue& value) = 0;
};

// A layer above core living inside a Worker. Made by its ExtensionFactory
// while the Worker is built, before it serves, so the layer's message
// handlers are in place for the first message.
class WorkerExtension {
 public:
  virtual ~WorkerExtension() = default;
  // The codec's side for the references (c10 RRefs) of every message this
  // worker encodes or decodes, or null. At most one extension of a worker
  // gives one; it must outlive the extension's use by the Worker (the
  // Worker drops its extensions last).
  virtual wire::ReferenceHook* reference_hook() { return nullptr; }
  // The side of every request and response this worker encodes or decodes
  // with encode_request, encode_response and decode, or null. At most one
  // extension of a worker gives one.
  virtual ContextHook* context_hook() { return nullptr; }
  // Graceful shutdown: called before the group's drain barrier (e.g. to
  // release references the application still holds) ...
  [[nodiscard]] virtual absl::Status before_graceful_join() {
    return absl::OkStatus();
  }
  // Once every worker of the group has begun its graceful shutdown (the
  // peer's barrier before it deletes its users' references), before the
  // group drains: what it sends is drained too. A dynamic group's leaver
  // calls it before it leaves.
  virtual void on_group_joined() {}
  // ... and after the drain, when nothing is in flight any more (e.g. a
  // leak check).
  [[nodiscard]] virtual absl::Status after_graceful_join() {
    return absl::OkStatus();
  }
};

// How the Worker treats the requests a layer's handler serves (see
// Worker::register_handler). Core knows no layer's message types: each
// layer says this of its own when it registers them.
struct HandlerTraits {
  // Sending one counts against RpcOptions::max_calls_in_flight, as a CALL
  // does: it runs a user function on the callee (or waits for one's value).
  bool counts_as_call = false;
  // Sent from a thread that runs LibTorch's legacy profiler, it is profiled
  // on its callee, as a CALL is (core/profiling.h): it runs user code there.
  bool profiled = false;
  // The handler is called on the agent's thread the request arrived on, not
  // on the pool: it must not block, and hands what may block or take long
  // to Worker::serve_on_pool() itself (a pool hop is a thread wake-up each
  // way). Profiled requests still go to the pool.
  bool serve_on_arrival = false;
};

// A RequestHandler that calls `method` on the layer object `weak` points to,
// or fails with CANCELLED once that object is gone (the worker shut down).
template <typename T>
RequestHandler route_to(std::weak_ptr<T> weak,
                        Future<Message> (T::*method)(Message)) {
  return [weak = std::move(weak), method](Message request) -> Future<Message> {
    std::shared_ptr<T> self = weak.lock();
    if (self == nullptr) {
      return Future<Message>::ready(
          absl::CancelledError("the worker is shut down"));
    }
    return ((*self).*method)(std::move(request));
  };
}

using ExtensionFactory =
    std::function<absl::StatusOr<std::unique_ptr<WorkerExtension>>(Worker&)>;

}  // namespace tether

#endif  // TETHER_CORE_WORKER_EXTENSION_H_
