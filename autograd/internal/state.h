// The autograd layer of one Worker (AutogradState) and what its parts
// share: the context registry (context_registry.cc), the ContextHook that
// adds send and recv functions (send_recv.cc), the engine that runs
// backward passes (engine.cc) and the cleanup of contexts (cleanup.cc).
// Private to //autograd.
#ifndef TETHER_AUTOGRAD_INTERNAL_STATE_H_
#define TETHER_AUTOGRAD_INTERNAL_STATE_H_

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <torch/csrc/autograd/function.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/internal/functions.h"
#include "core/rpc.h"
#include "core/toolkit/lifeline.h"
#include "core/wire/context_meta.h"

namespace tether::autograd::internal {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

// The context current on this thread: entered by the user, or the context of
// the request this thread serves. One per thread, whatever the worker.
inline thread_local int64_t thread_context = -1;

// Context ids: the creating worker's id above this bit.
inline constexpr int kWorkerShift = 48;

// One context on one worker.
struct ContextRecord {
  explicit ContextRecord(int64_t id) : id(id) {}

  const int64_t id;
  absl::Mutex mu;
  // Send nodes by autograd message id.
  absl::flat_hash_map<int64_t, std::shared_ptr<SendNode>> sends
      ABSL_GUARDED_BY(mu);
  // Recv nodes by the message id their sender gave (ids are unique: the
  // sender's id is in their top bits), kept while the context lives, as
  // the peer's context keeps them.
  absl::flat_hash_map<int64_t, std::shared_ptr<RecvNode>> recvs
      ABSL_GUARDED_BY(mu);
  // Workers this context exchanged messages with: cleanup reaches them.
  absl::flat_hash_set<int32_t> peers ABSL_GUARDED_BY(mu);
  // Leaf -> gradient, in the order leaves first got one.
  std::vector<std::pair<at::Tensor, at::Tensor>> grads ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<const c10::TensorImpl*, size_t> grad_index
      ABSL_GUARDED_BY(mu);
  // Engine passes of this context on this worker run one at a time.
  absl::Mutex engine_mu;
};

// Gradients a pass has for recv nodes of the worker whose BACKWARD it
// serves: they go back in that BACKWARD's response (an
// AUTOGRAD_BACKWARD_RET), not in a BACKWARD of their own, which saves a
// round trip per level of a backward that comes back to its caller.
struct ReturnedGrads {
  int64_t message;  // the autograd message id of the requester's send node
  c10::List<at::Tensor> grads;
};
using Returned = std::vector<ReturnedGrads>;

// Work for the thread that waits in the root's backward(): the passes for
// gradients that responses return to the root run there instead of on a
// thread woken for them (one wake-up less per returned hop). Work posted
// after that wait ended (an error ended it first) goes to at::launch. The
// thread waits on a Future, so it waits as every future wait does (and
// polls first when RpcOptions::busy_poll asks for it).
class Drain {
 public:
  void post(std::function<void()> work) {
    Promise<bool> wake;
    bool closed;
    {
      absl::MutexLock lock(&mu_);
      closed = closed_;
      if (!closed) {
        queue_.push_back(std::move(work));
        wake = std::exchange(wake_, Promise<bool>());
      }
    }
    if (closed) {
      at::launch(std::move(work));
      return;
    }
    wake.set(true);  // never under mu_: a completer holds no lock
  }

  // Runs what is posted until `done` completes; returns its result.
  static absl::StatusOr<Returned> run_until(const std::shared_ptr<Drain>& drain,
                                            Future<Returned> done) {
    done.on_complete([drain](const absl::StatusOr<Returned>& /*result*/) {
      Promise<bool> wake;
      {
        absl::MutexLock lock(&drain->mu_);
        drain->finished_ = true;
        wake = std::exchange(drain->wake_, Promise<bool>());
      }
      wake.set(true);
    });
    for (;;) {
      std::function<void()> work;
      Future<bool> woken;
      {
        absl::MutexLock lock(&drain->mu_);
        if (!drain->queue_.empty()) {
          work = std::move(drain->queue_.front());
          drain->queue_.pop_front();
        } else if (drain->finished_) {
          drain->closed_ = true;
          break;
        } else {
          woken = drain->wake_.future();
        }
      }
      if (work) {
        work();
      } else {
        (void)woken.wait(absl::InfiniteFuture());
      }
    }
    return done.result();
  }

 private:
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  // Completed (and replaced) when work is posted or the wait is over.
  Promise<bool> wake_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// What the passes of one backward on one worker share.
struct PassScope {
  std::shared_ptr<ContextRecord> record;
  bool retain_graph = false;
  // The worker whose BACKWARD these passes serve: gradients for its recv
  // nodes go back in the response. -1 at the root.
  int32_t requester = -1;
  // At the root: its waiting thread, which runs the passes for returned
  // gradients. Null elsewhere (at::launch runs them).
  std::shared_ptr<Drain> drain;
};

// The autograd layer of one Worker: its contexts, the hook every message
// goes through, and the BACKWARD and CLEANUP handlers.
class AutogradState final : public ContextHook,
                            public std::enable_shared_from_this<AutogradState> {
 public:
  explicit AutogradState(Worker& worker)
      : worker_(worker), self_(worker.get_current_worker_info()) {}

  const WorkerInfo& self() const { return self_; }

  // Runs fn(worker) unless closed; true if it ran.
  template <typename F>
  bool with_worker(F fn) {
    return worker_.use(std::move(fn));
  }

  // The worker is going away: waits out the calls that use it.
  void close();

  // ---- contexts (context_registry.cc)

  int64_t new_context();

  std::shared_ptr<ContextRecord> find(int64_t id);

  // A context another worker created, first seen here; null for one of this
  // worker's own that is gone already.
  std::shared_ptr<ContextRecord> find_or_join(int64_t id);

  int64_t live();

  // The peer's text ("Error on Node <rank>: <what>"), then where.
  absl::Status backward_failed(absl::string_view what) const;

  absl::Status unknown_context(int64_t id) const;

  absl::StatusOr<ContextNodes> nodes(int64_t id);

  absl::StatusOr<std::vector<int32_t>> peers(int64_t id);

  absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> gradients(int64_t id);

  // ---- ContextHook (send_recv.cc)

  int64_t current_context() const override { return thread_context; }

  int64_t exchange_current_context(int64_t context) override {
    return std::exchange(thread_context, context);
  }

  absl::StatusOr<wire::ContextMeta> on_send(
      int64_t context, const WorkerInfo& to,
      const c10::IValue& value) override;

  absl::Status on_receive(const wire::ContextMeta& meta,
                          c10::IValue& value) override;

  // ---- backward (engine.cc)

  // One engine pass on this worker from `roots` with `grads` (defined,
  // matching): leaf gradients accumulate in the context, gradients reaching
  // recv nodes go back to their senders, except those of scope.requester
  // (the worker whose BACKWARD this pass serves), which the returned future
  // carries for the response. Completes when every BACKWARD message it sent
  // is done (first error wins), with what they returned for the requester
  // too.
  Future<Returned> pass(const PassScope& scope, const edge_list& roots,
                        const variable_list& grads);

  // Contexts with an engine pass running on this worker, each pass counted
  // until everything it sent on is done (the peer's
  // num_current_backward_passes: one per backward, however many passes it
  // runs here, as a backward that comes back to this worker nests them).
  int64_t backward_passes() const;

  Future<Returned> run_pass(const PassScope& scope, const edge_list& roots,
                            const variable_list& grads);

  // A pass from the send node of autograd message `message` with the
  // gradients `incoming` (one per tensor it sent; undefined: none), for a
  // BACKWARD that arrived or gradients returned in a BACKWARD's response.
  Future<Returned> pass_from_send(const PassScope& scope, int64_t message,
                                  std::vector<at::Tensor> incoming);

  // pass_from_send's requester for a BACKWARD that arrived: the worker the
  // send node sent to, which is the one whose gradients came back.
  static constexpr int32_t kFromSendNode = -2;

  // The passes for gradients that a BACKWARD's response returned: on the
  // root's waiting thread (scope.drain), elsewhere on an inter-op thread of
  // LibTorch (at::launch). Never on the thread that completed the response,
  // a backend thread, which must not run an engine pass. Their own returns
  // are for scope.requester, whose pass sent that BACKWARD.
  Future<Returned> run_returned(const PassScope& scope,
                                std::vector<ReturnedGrads> returned);

  // Adds the gradients this pass computed for `leaves` (the first of
  // `results`) to the context, as the peer's engine does: each leaf's
  // AccumulateGrad pre-hooks and tensor hooks change the gradient first,
  // its post-hooks see it after, and a gradient nothing else holds is kept
  // without a copy (AccumulateGrad's own rule; one that `results` holds for
  // another leaf too is copied, as the peer holds every result until all
  // are accumulated).
  // Accumulates each leaf's gradient into the context, then runs the
  // leaf's post hooks. Those run inside a graph task of LibTorch's engine
  // (as the engine runs an AccumulateGrad's), so that a hook may queue a
  // final callback (Engine::queue_callback), which runs before this
  // returns. A hook reads and writes a leaf's gradient where local
  // autograd keeps it, in .grad: DistributedDataParallel's reducer copies
  // it into its buckets and writes the all-reduced average back at the
  // end of the graph task. So while the hooks run, .grad holds the
  // context's gradient; what it holds afterwards becomes the context's,
  // and the leaf's own .grad is put back.
  void accumulate(ContextRecord& record,
                  const std::vector<std::shared_ptr<Node>>& leaves,
                  const variable_list& results);

  static at::Tensor context_grad(ContextRecord& record,
                                 const at::Tensor& leaf);

  // Runs `fn` as the one node of a graph task of LibTorch's engine, on
  // this thread (a CPU graph task runs on its caller), so that what it
  // calls may queue final callbacks; they have run when this returns.
  static void run_in_graph_task(std::function<void()> fn);

  // Ships the gradients of `recv` to the worker that sent its tensors; runs
  // the passes for what its response returns. The future completes when
  // all of that is done, with what those passes have for `requester`.
  Future<Returned> send_backward(const PassScope& scope, const RecvNode& recv,
                                 c10::List<at::Tensor> grads);

  // The gradients a BACKWARD's response from `peer` returned: none for an
  // ACK; an AUTOGRAD_BACKWARD_RET carries (message ids, how many gradients
  // each, the gradients) = (int[], int[], Tensor[]).
  absl::StatusOr<std::vector<ReturnedGrads>> decode_returned(
      const Message& response, const std::string& peer);

  // BACKWARD: (context, message, retain_graph, grads) for a send node here.
  // The response returns the gradients the passes have for the sender's
  // recv nodes (AUTOGRAD_BACKWARD_RET), or is an ACK.
  Future<Message> on_backward(Message request);

  absl::StatusOr<Message> encode_returned(const Returned& returned);

  // ---- cleanup (cleanup.cc)

  // Forgets `id` here and tells the workers it exchanged messages with
  // (except `from`), who do the same; completes when they answered.
  Future<bool> cleanup(int64_t id, int32_t from);

  // A Context was left: forgets it here at once and releases it on its
  // peers without waiting (each send is bounded by the RPC timeout).
  // await_releases() waits for the releases in flight.
  void release(int64_t id);

  absl::Status await_releases(absl::Time deadline);

  Future<Message> on_cleanup(Message request);

 private:
  tether::internal::Lifeline<Worker> worker_;
  absl::Mutex mu_;
  const WorkerInfo self_;
  std::atomic<int64_t> next_context_{0};
  // Engine passes running, by context. Shared with the callbacks that end
  // a pass, which may outlive this.
  struct RunningPasses {
    absl::Mutex mu;
    absl::flat_hash_map<int64_t, int64_t> by_context ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<RunningPasses> passes_ = std::make_shared<RunningPasses>();
  std::atomic<int64_t> next_message_{0};
  absl::Mutex releases_mu_;
  int64_t releases_in_flight_ ABSL_GUARDED_BY(releases_mu_) = 0;
  absl::flat_hash_map<int64_t, std::shared_ptr<ContextRecord>> contexts_
      ABSL_GUARDED_BY(mu_);
};

// The autograd layer of `worker`; null if it has no autograd extension.
std::shared_ptr<AutogradState> state_of(Worker& worker);

}  // namespace tether::autograd::internal

#endif  // TETHER_AUTOGRAD_INTERNAL_STATE_H_
