// Between tether's Future and LibTorch's c10::ivalue::Future, for functions
// that answer later (the peer's @rpc.functions.async_execution).
//
// A function a Worker serves (an operator returning Future(...), a native
// function of core/native_function.h, a layer's CallableProvider such as
// the Python front end's) may return a c10::ivalue::Future instead of a
// value: the Worker answers its caller when that future completes, and no
// pool thread waits for it meanwhile. So a function can call onward and
// hand back that call's future:
//
//   // on worker "b": the answer is c's, and no thread of b waits for it
//   tether::Future<c10::IValue> relay(at::Tensor x) {
//     return tether::rpc_async("c", "aten::add", {x, 1});
//   }
//
// Errors cross as a StatusError (a std::runtime_error carrying the Status),
// so the caller sees the code the failure had (NOT_FOUND, UNAVAILABLE ...);
// any other exception becomes UNKNOWN with its text.
//
// Thread safety: all functions may be called from any thread. The futures
// they return complete on the thread that completes their source.
#ifndef TETHER_CORE_IVALUE_FUTURE_H_
#define TETHER_CORE_IVALUE_FUTURE_H_

#include <ATen/core/ivalue.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <exception>
#include <stdexcept>

#include "core/future.h"

namespace tether {

// An exception that carries a Status across LibTorch's futures.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(absl::Status status);
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// The Status an exception stands for: a StatusError's own, else UNKNOWN
// with the exception's text (a c10::Error's without its backtrace).
absl::Status status_of(std::exception_ptr error);

// A c10::ivalue::Future (of type Any) that completes as `future` does.
c10::intrusive_ptr<c10::ivalue::Future> to_ivalue_future(
    Future<c10::IValue> future);

// A tether Future that completes as `future` does.
Future<c10::IValue> from_ivalue_future(
    c10::intrusive_ptr<c10::ivalue::Future> future);

// A function's result as a Future: a result that is a c10::ivalue::Future
// completes when it does; anything else is ready at once.
Future<c10::IValue> settle(absl::StatusOr<c10::IValue> result);

}  // namespace tether

#endif  // TETHER_CORE_IVALUE_FUTURE_H_
