#include "python/src/callable_provider.h"

#include <exception>
#include <optional>
#include <string>

#include "python/src/convert.h"
#include "python/src/gil_profiling.h"

namespace tether::python {

absl::StatusOr<c10::IValue> PythonCallables::call(
    absl::string_view name, std::vector<c10::IValue> args,
    const Kwargs& kwargs) {
  std::optional<py::gil_scoped_acquire> gil;
  acquire_gil(gil);
  try {
    py::tuple py_args(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      py_args[i] = to_python(args[i]);
    }
    py::dict py_kwargs;
    for (const auto& [key, value] : kwargs) {
      py_kwargs[py::str(key)] = to_python(value);
    }
    py::object result = py::handle(serve_)(
        py::str(name.data(), name.size()), py_args, py_kwargs);
    return to_ivalue(result, Objects::kKeep, "the result");
  } catch (py::error_already_set& e) {
    if (e.matches(failure_)) {
      py::tuple failure = e.value().attr("args");
      return absl::Status(
          static_cast<absl::StatusCode>(failure[0].cast<int>()),
          failure[1].cast<std::string>());
    }
    return absl::InternalError(std::string("tether's Python callee: ") +
                               e.what());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

}  // namespace tether::python
