// absl::Status on its way to Python, for the extension module tether._C.
//
// A failed Status is thrown as RpcError; the translator module.cc registers
// raises what tether.rpc._errors.exception_for makes of it (the remote
// exception's builtin type, else RuntimeError), so a caller's `except`
// clauses see the peer's exception types.
#ifndef TETHER_PYTHON_SRC_STATUS_H_
#define TETHER_PYTHON_SRC_STATUS_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <exception>
#include <string>
#include <utility>

#include "core/rpc.h"

namespace tether::python {

class RpcError : public std::exception {
 public:
  explicit RpcError(absl::Status status)
      : status_(std::move(status)), text_(status_.message()) {}
  const char* what() const noexcept override { return text_.c_str(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  std::string text_;
};

inline void check(const absl::Status& status) {
  if (!status.ok()) throw RpcError(status);
}

template <typename T>
T value_or_throw(absl::StatusOr<T> result) {
  if (!result.ok()) throw RpcError(result.status());
  return *std::move(result);
}

// The worker this thread's calls act on (current_worker()); before
// init_rpc, raises what every call raises then.
inline Worker& worker_or_throw() {
  Worker* me = current_worker();
  if (me == nullptr) check(get_current_worker_info().status());
  return *me;
}

}  // namespace tether::python

#endif  // TETHER_PYTHON_SRC_STATUS_H_
