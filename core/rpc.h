// The free functions of tether's API, shaped like torch.distributed.rpc.
//
// init_rpc() makes the process's default Worker; the other functions act on
// the Worker whose request the calling thread is serving (so an operator
// that calls further reaches out from its own worker), else on the default
// one. Without a Worker they return FAILED_PRECONDITION.
//
//   tether::BackendRegistry registry;
//   TETHER_RETURN_IF_ERROR(tether::backends::register_builtin_backends(registry));
//   TETHER_RETURN_IF_ERROR(tether::init_rpc("w0", 0, 2, options, registry));
//   absl::StatusOr<at::Tensor> sum =
//       tether::rpc_sync<at::Tensor>("w1", "aten::add.Tensor", {a, b});
//   if (!sum.ok()) return sum.status();  // never `->` on a failed StatusOr
//   TETHER_RETURN_IF_ERROR(tether::shutdown());
//
// (tether/tether.h's init_rpc(name) needs no registry; the macros are
// core/status_macros.h's.)
//
// Thread safety: all functions may be called from any thread, but shutdown()
// must not race with calls that use the Worker it releases.
#ifndef TETHER_CORE_RPC_H_
#define TETHER_CORE_RPC_H_

#include <absl/strings/str_cat.h>

#include "core/typed_result.h"
#include "core/worker.h"

namespace tether {

// ALREADY_EXISTS if the process has a default Worker already. With
// world_size kDynamicGroup the worker joins a dynamic group, and
// shutdown() leaves it (Worker::create, Worker::shutdown).
[[nodiscard]] absl::Status init_rpc(
    const std::string& name, int rank, int world_size,
    const RpcOptions& options, const BackendRegistry& registry,
    const std::vector<ExtensionFactory>& extensions = {});

// Shuts the default Worker down (see Worker::shutdown) and releases it.
[[nodiscard]] absl::Status shutdown(bool graceful = true,
                                    absl::Duration timeout = kDefaultTimeout);

Future<c10::IValue> rpc_async(const To& to, absl::string_view fn,
                              std::vector<c10::IValue> args,
                              Kwargs kwargs = {},
                              absl::Duration timeout = kDefaultTimeout);

[[nodiscard]] absl::StatusOr<c10::IValue> rpc_sync(
    const To& to, absl::string_view fn, std::vector<c10::IValue> args,
    Kwargs kwargs = {}, absl::Duration timeout = kDefaultTimeout);

// rpc_sync<T>: the result as a T (core/typed_result.h): INVALID_ARGUMENT
// naming both types when it is another type.
//
//   absl::StatusOr<at::Tensor> sum =
//       tether::rpc_sync<at::Tensor>("w1", "aten::add.Tensor", {a, b});
template <typename T>
[[nodiscard]] absl::StatusOr<T> rpc_sync(const To& to, absl::string_view fn,
                                         std::vector<c10::IValue> args,
                                         Kwargs kwargs = {},
                                         absl::Duration timeout =
                                             kDefaultTimeout) {
  absl::StatusOr<c10::IValue> result =
      rpc_sync(to, fn, std::move(args), std::move(kwargs), timeout);
  if (!result.ok()) return result.status();
  return value_as<T>(*std::move(result),
                     absl::StrCat("the result of '", fn, "'"));
}

// The default Worker's bound of calls that give none; zero means none.
// set_rpc_timeout affects later calls only. FAILED_PRECONDITION without a
// Worker.
[[nodiscard]] absl::StatusOr<absl::Duration> get_rpc_timeout();
[[nodiscard]] absl::Status set_rpc_timeout(absl::Duration timeout);

[[nodiscard]] absl::StatusOr<WorkerInfo> get_worker_info(const To& to);
[[nodiscard]] absl::StatusOr<WorkerInfo> get_current_worker_info();
// WARNING: keep the StatusOr before iterating: `for (auto& w :
// *get_all_worker_infos())` reads a temporary that is already destroyed
// (and aborts if it holds an error). Write
//   TETHER_ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers,
//                           tether::get_all_worker_infos());
//   for (const WorkerInfo& w : workers) ...
[[nodiscard]] absl::StatusOr<std::vector<WorkerInfo>> get_all_worker_infos();

// Worker::all_gather and Worker::barrier of the default (or serving)
// Worker: over `names` (empty: the whole group), bounded by liveness.
[[nodiscard]] absl::StatusOr<std::map<std::string, c10::IValue>> all_gather(
    c10::IValue value, std::vector<std::string> names = {},
    absl::Duration timeout = absl::InfiniteDuration());
[[nodiscard]] absl::Status barrier(
    std::vector<std::string> names = {},
    absl::Duration timeout = absl::InfiniteDuration());

// The Worker the functions above act on, or null.
Worker* current_worker();

}  // namespace tether

#endif  // TETHER_CORE_RPC_H_
