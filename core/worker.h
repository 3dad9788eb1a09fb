// Worker: one member of an RPC group, and the public API of tether's core.
//
// A Worker owns one Agent (chosen by backend name from a BackendRegistry),
// the callables it serves and a thread pool that runs them. Several Workers
// may live in one process (tests do this); the free functions of
// core/rpc.h act on the process's default Worker, or on the Worker whose
// request the calling thread is serving.
//
// Ownership: create() returns the only owner. Destroying a Worker shuts it
// down (not gracefully) first.
//
// Thread safety: every method may be called from any thread. Futures from
// rpc_async complete on an agent thread; their callbacks must not block.
#ifndef TETHER_CORE_WORKER_H_
#define TETHER_CORE_WORKER_H_

#include <ATen/core/ivalue.h>
#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/agent.h"
#include "core/backend_registry.h"
#include "core/callables.h"
#include "core/future.h"

namespace c10 {
class ThreadPool;
}  // namespace c10

namespace tether {

// Passed as a timeout: use RpcOptions::default_timeout.
inline constexpr absl::Duration kDefaultTimeout = absl::Seconds(-1);

struct RpcOptions {
  // The backend's name in the registry.
  std::string backend = "tensorpipe";
  // Where the group meets; see core/rendezvous.h.
  std::string init_method = "env://";
  // Threads that run incoming calls.
  int num_worker_threads = 16;
  // Bound of every call that does not give its own; zero means none.
  absl::Duration default_timeout = absl::Seconds(60);
  // Bound of the rendezvous at init.
  absl::Duration init_timeout = absl::Seconds(60);
  // Bound of the graceful shutdown barrier.
  absl::Duration shutdown_timeout = absl::Seconds(60);
  // Per-backend settings, "key" -> "value"; each backend documents its keys.
  absl::flat_hash_map<std::string, std::string> backend_settings;
  // TorchScript sources compiled at init, before this worker serves: peers
  // may call their functions as soon as their own init_rpc returns.
  std::vector<std::string> scripts;
};

// Who to call: a worker's name, its rank, or its WorkerInfo.
class To {
 public:
  To(const char* name) : target_(std::string(name)) {}          // NOLINT
  To(std::string name) : target_(std::move(name)) {}            // NOLINT
  To(absl::string_view name) : target_(std::string(name)) {}    // NOLINT
  To(int rank) : target_(rank) {}                               // NOLINT
  To(WorkerInfo info) : target_(std::move(info)) {}             // NOLINT

  const std::variant<std::string, int, WorkerInfo>& target() const {
    return target_;
  }

 private:
  std::variant<std::string, int, WorkerInfo> target_;
};

class Worker {
 public:
  // Joins the group and starts serving. A negative rank or world size is
  // read from the environment (core/rendezvous.h). Errors come from the rendezvous
  // (core/rendezvous.h), the registry (NOT_FOUND for an unknown backend,
  // FAILED_PRECONDITION for one not viable here) and the backend.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Worker>> create(
      const std::string& name, int rank, int world_size,
      const RpcOptions& options, const BackendRegistry& registry);

  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Calls `fn` (an operator or TorchScript function name) on `to`.
  // Errors: NOT_FOUND for an unknown worker or function, INVALID_ARGUMENT for
  // arguments that do not fit the schema, DEADLINE_EXCEEDED past `timeout`,
  // UNAVAILABLE for a lost peer, CANCELLED after shutdown, UNKNOWN for an
  // exception raised by the function. Remote errors name the worker and
  // the function.
  Future<c10::IValue> rpc_async(const To& to, absl::string_view fn,
                                std::vector<c10::IValue> args,
                                Kwargs kwargs = {},
                                absl::Duration timeout = kDefaultTimeout);

  [[nodiscard]] absl::StatusOr<c10::IValue> rpc_sync(
      const To& to, absl::string_view fn, std::vector<c10::IValue> args,
      Kwargs kwargs = {}, absl::Duration timeout = kDefaultTimeout);

  // Graceful: waits until every worker of the group has called shutdown and
  // no call is in flight anywhere, then stops. Otherwise stops at once.
  // Calls afterwards fail with CANCELLED. Idempotent.
  [[nodiscard]] absl::Status shutdown(bool graceful = true);

  // TorchScript functions that peers may call on this worker.
  [[nodiscard]] absl::Status register_script(const std::string& source);

  [[nodiscard]] absl::StatusOr<WorkerInfo> get_worker_info(
      const To& to) const;
  const WorkerInfo& get_current_worker_info() const;
  const std::vector<WorkerInfo>& get_all_worker_infos() const;

  // The Worker serving the request that runs on this thread, or null.
  static Worker* serving();

 private:
  Worker(RpcOptions options, std::unique_ptr<Agent> agent);

  Future<Message> handle_request(Message request);
  Message process_request(const Message& request);
  absl::Duration resolve_timeout(absl::Duration timeout) const;

  const RpcOptions options_;
  Callables callables_;
  std::unique_ptr<c10::ThreadPool> pool_;
  std::unique_ptr<Agent> agent_;
  absl::Mutex mu_;
  // Running -> (graceful) Draining -> Stopped. While draining, calls still
  // go out: an operator being served may call onward (A -> B -> C), and the
  // drain waits for those calls too.
  enum class State { kRunning, kDraining, kStopped };
  State state_ ABSL_GUARDED_BY(mu_) = State::kRunning;
};

}  // namespace tether

#endif  // TETHER_CORE_WORKER_H_
