// The futures of tether._C: a tether future as the torch.futures.Future
// (tether.rpc._future.RpcFuture) rpc_async and RRef._get_future return.
//
// Threads and the GIL: the torch future completes on the thread that waits
// for it (PyCompletion::help) or on threads of this file (Completer), which
// take the GIL to turn the value into a Python object (unless torch's
// future converts it alike when it is read: tensors, numbers, strings) and
// run the user's callbacks: an agent's threads never wait for the GIL.
#ifndef TETHER_PYTHON_SRC_FUTURES_H_
#define TETHER_PYTHON_SRC_FUTURES_H_

#include <ATen/core/ivalue.h>
#include <absl/status/statusor.h>
#include <pybind11/pybind11.h>

#include <atomic>

#include "core/rpc.h"

namespace tether::python {

namespace py = pybind11;

// What a Python future of rpc_async (tether.rpc._future.RpcFuture) shares
// with the completion of its tether future: the first of the completer
// thread and a thread waiting in RpcFuture.wait() to claim it turns the
// result into a Python object and completes the torch future. The waiter
// usually wins: it read the answer itself (the assist) and needs no other
// thread to wake.
struct PyCompletion {
  Future<c10::IValue> future;
  c10::intrusive_ptr<c10::ivalue::Future> jit;
  std::atomic<bool> claimed{false};
  // A thread is in help(): it will finish, so the completion need not wake
  // a completer thread for it.
  std::atomic<bool> waited{false};

  // Without the GIL; takes it to convert a value torch would not.
  void finish(const absl::StatusOr<c10::IValue>& result);

  // RpcFuture.wait(), before the torch future's own wait: waits for the
  // tether future (the assisted wait when this thread sent the request)
  // and completes the torch future here unless the completer has.
  void help();
};

// A tether.rpc._future.RpcFuture (a torch.futures.Future) completed with
// `future`'s result, as a Python object (RpcError on failure).
py::object python_future(Future<c10::IValue> future);

}  // namespace tether::python

#endif  // TETHER_PYTHON_SRC_FUTURES_H_
