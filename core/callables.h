// Callables: what a worker lets its peers run, looked up by name.
//
// The allow-list of tether (docs/architecture.md section 3, docs/security.md):
// LibTorch operators found through the c10 dispatcher, builtins
// ("aten::add.Tensor") and the user's own TORCH_LIBRARY operators
// ("myns::my_fn"), TorchScript functions compiled on this worker with
// add_script(), the user's custom classes (TORCH_LIBRARY's class_):
// constructed by their qualified name ("__torch__.torch.classes.myns.Shard")
// and driven through their registered methods (call_method), and the names a
// layer above core serves under its own prefix with a CallableProvider (the
// Python front end serves "py::module:qualname" by its policy). Nothing else
// runs; nothing arrives as code. Operators that read or write the callee's
// files (aten::from_file) are refused with PERMISSION_DENIED.
//
// An operator named without its overload ("aten::add") is the overload whose
// schema fits the arguments, as the peer's builtin matching picks one: every
// positional argument, keyword and default must fit, and among the overloads
// that fit, the one needing the fewest conversions (an int passed as a
// Scalar) wins. When none fits, or several fit equally, the error lists the
// candidates' schemas.
//
// Thread safety: all methods may be called from any thread.
#ifndef TETHER_CORE_CALLABLES_H_
#define TETHER_CORE_CALLABLES_H_

#include <ATen/core/ivalue.h>
#include <absl/base/thread_annotations.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace torch::jit {
struct CompilationUnit;
}  // namespace torch::jit

namespace tether {

using Kwargs = std::unordered_map<std::string, c10::IValue>;

// Callables a layer above core serves under a name prefix, by its own policy:
// the Python front end serves "py::module:qualname" this way, so core knows
// no language runtime (docs/architecture.md section 11).
//
// Thread safety: call() runs concurrently on the worker pool's threads.
class CallableProvider {
 public:
  virtual ~CallableProvider() = default;
  // Runs `name` (its prefix included) on `args` and `kwargs`, on the pool
  // thread serving the call (it may block, e.g. on a nested call). Errors:
  // PERMISSION_DENIED for a name the provider's policy refuses, NOT_FOUND
  // for an unknown one, INVALID_ARGUMENT for bad arguments, UNKNOWN with the
  // text of an exception the function raised.
  [[nodiscard]] virtual absl::StatusOr<c10::IValue> call(
      absl::string_view name, std::vector<c10::IValue> args,
      const Kwargs& kwargs) = 0;
};

class Callables {
 public:
  // Serves the names that start with `prefix` (e.g. "py::") by `provider`.
  // INVALID_ARGUMENT for an empty prefix or one that does not end in "::",
  // ALREADY_EXISTS if the prefix is taken.
  [[nodiscard]] absl::Status add_provider(
      std::string prefix, std::shared_ptr<CallableProvider> provider);

  // Compiles TorchScript `source`; its functions become callable by their
  // names. INVALID_ARGUMENT with the compiler's message if it does not
  // compile; ALREADY_EXISTS if a function name is taken.
  [[nodiscard]] absl::Status add_script(const std::string& source);

  // Runs `name` on `args` and `kwargs` after checking them against its
  // schema. A function that returns nothing gives None, several values a
  // tuple. Errors: NOT_FOUND naming an unknown function; INVALID_ARGUMENT
  // (from the schema check, naming the argument; or no overload / several
  // overloads fit, listing them); PERMISSION_DENIED for a refused operator;
  // UNKNOWN carrying the text of an exception the function raised.
  [[nodiscard]] absl::StatusOr<c10::IValue> call(
      absl::string_view name, std::vector<c10::IValue> args,
      const Kwargs& kwargs) const;

  // Runs registered method `method` of `self`, an instance of a custom class.
  // Errors: INVALID_ARGUMENT if `self` is not an object, NOT_FOUND for a
  // missing method (naming it and the class), then as call().
  [[nodiscard]] static absl::StatusOr<c10::IValue> call_method(
      const c10::IValue& self, absl::string_view method,
      std::vector<c10::IValue> args, const Kwargs& kwargs);

 private:
  // The overloads of a bare operator name ("aten::add"), cached.
  std::shared_ptr<const std::vector<c10::OperatorHandle>> overloads(
      const std::string& name) const;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<torch::jit::CompilationUnit>> units_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::shared_ptr<CallableProvider>>>
      providers_ ABSL_GUARDED_BY(mu_);
  mutable std::unordered_map<
      std::string, std::shared_ptr<const std::vector<c10::OperatorHandle>>>
      overloads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tether

#endif  // TETHER_CORE_CALLABLES_H_
