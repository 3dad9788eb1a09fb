#include "core/rpc.h"

#include <absl/strings/str_cat.h>

namespace tether {
namespace {

absl::Mutex default_mu(absl::kConstInit);
// Owned; a raw pointer so that no destructor runs at process exit.
Worker* default_worker ABSL_GUARDED_BY(default_mu) = nullptr;

absl::Status no_worker() {
  return absl::FailedPreconditionError(
      "RPC has not been initialized: no RPC worker in this process; call "
      "tether::init_rpc() first");
}

}  // namespace

Worker* current_worker() {
  if (Worker* serving = Worker::serving()) return serving;
  absl::MutexLock lock(&default_mu);
  return default_worker;
}

absl::Status init_rpc(const std::string& name, int rank, int world_size,
                      const RpcOptions& options,
                      const BackendRegistry& registry,
                      const std::vector<ExtensionFactory>& extensions) {
  {
    absl::MutexLock lock(&default_mu);
    if (default_worker != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat(
          "init_rpc called twice: RPC is already initialized as worker '",
          default_worker->get_current_worker_info().name, "'"));
    }
  }
  absl::StatusOr<std::unique_ptr<Worker>> worker =
      Worker::create(name, rank, world_size, options, registry, extensions);
  if (!worker.ok()) return worker.status();
  absl::MutexLock lock(&default_mu);
  if (default_worker != nullptr) {
    return absl::AlreadyExistsError("init_rpc raced with another init_rpc");
  }
  default_worker = worker->release();
  return absl::OkStatus();
}

absl::Status shutdown(bool graceful, absl::Duration timeout) {
  Worker* worker;
  {
    absl::MutexLock lock(&default_mu);
    worker = default_worker;
  }
  if (worker == nullptr) return no_worker();
  absl::Status stopped = worker->shutdown(graceful, timeout);
  absl::MutexLock lock(&default_mu);
  if (default_worker == worker) {
    delete default_worker;
    default_worker = nullptr;
  }
  return stopped;
}

Future<c10::IValue> rpc_async(const To& to, absl::string_view fn,
                              std::vector<c10::IValue> args, Kwargs kwargs,
                              absl::Duration timeout) {
  Worker* worker = current_worker();
  if (worker == nullptr) return Future<c10::IValue>::ready(no_worker());
  return worker->rpc_async(to, fn, std::move(args), std::move(kwargs),
                           timeout);
}

absl::StatusOr<c10::IValue> rpc_sync(const To& to, absl::string_view fn,
                                     std::vector<c10::IValue> args,
                                     Kwargs kwargs, absl::Duration timeout) {
  return rpc_async(to, fn, std::move(args), std::move(kwargs), timeout).get();
}

absl::StatusOr<absl::Duration> get_rpc_timeout() {
  Worker* worker = current_worker();
  if (worker == nullptr) return no_worker();
  return worker->rpc_timeout();
}

absl::Status set_rpc_timeout(absl::Duration timeout) {
  Worker* worker = current_worker();
  if (worker == nullptr) return no_worker();
  worker->set_rpc_timeout(timeout);
  return absl::OkStatus();
}

absl::StatusOr<WorkerInfo> get_worker_info(const To& to) {
  Worker* worker = current_worker();
  if (worker == nullptr) return no_worker();
  return worker->get_worker_info(to);
}

absl::StatusOr<WorkerInfo> get_current_worker_info() {
  Worker* worker = current_worker();
  if (worker == nullptr) return no_worker();
  return worker->get_current_worker_info();
}

absl::StatusOr<std::map<std::string, c10::IValue>> all_gather(
    c10::IValue value, std::vector<std::string> names,
    absl::Duration timeout) {
  Worker* worker = current_worker();
  if (worker == nullptr) return no_worker();
  return worker->all_gather(std::move(value), std::move(names), timeout);
}

absl::Status barrier(std::vector<std::string> names, absl::Duration timeout) {
  Worker* worker = current_worker();
  if (worker == nullptr) return no_worker();
  return worker->barrier(std::move(names), timeout);
}

absl::StatusOr<std::vector<WorkerInfo>> get_all_worker_infos() {
  Worker* worker = current_worker();
  if (worker == nullptr) return no_worker();
  return worker->get_all_worker_infos();
}

}  // namespace tether
