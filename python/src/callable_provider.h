// The callable provider of tether._C: the worker's "py::" functions.
#ifndef TETHER_PYTHON_SRC_CALLABLE_PROVIDER_H_
#define TETHER_PYTHON_SRC_CALLABLE_PROVIDER_H_

#include <ATen/core/ivalue.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "core/callables.h"

namespace tether::python {

namespace py = pybind11;

// Serves "py::module:qualname" calls by tether.rpc._callee.serve, which
// applies the worker's allow policy (docs/security.md).
class PythonCallables : public CallableProvider {
 public:
  // `serve` is a module-level function: it lives as long as the
  // interpreter, so the reference taken here is never given back (a
  // provider may be destroyed without the GIL).
  explicit PythonCallables(py::handle serve, py::handle failure)
      : serve_(serve.inc_ref().ptr()), failure_(failure.inc_ref().ptr()) {}

  absl::StatusOr<c10::IValue> call(absl::string_view name,
                                   std::vector<c10::IValue> args,
                                   const Kwargs& kwargs) override;

 private:
  PyObject* serve_;
  PyObject* failure_;
};

}  // namespace tether::python

#endif  // TETHER_PYTHON_SRC_CALLABLE_PROVIDER_H_
