// Callables: what a worker lets its peers run, looked up by name.
//
// The allow-list of tether (ARCHITECTURE.md section 3): LibTorch operators
// found through the c10 dispatcher, builtins ("aten::add.Tensor") and the
// user's own TORCH_LIBRARY operators ("myns::my_fn"), TorchScript functions
// compiled on this worker with add_script(), and the user's custom classes
// (TORCH_LIBRARY's class_): constructed by their qualified name
// ("__torch__.torch.classes.myns.Shard") and driven through their
// registered methods (call_method). Nothing else runs; nothing arrives as
// code.
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
#include <vector>

namespace torch::jit {
struct CompilationUnit;
}  // namespace torch::jit

namespace tether {

using Kwargs = std::unordered_map<std::string, c10::IValue>;

class Callables {
 public:
  // Compiles TorchScript `source`; its functions become callable by their
  // names. INVALID_ARGUMENT with the compiler's message if it does not
  // compile; ALREADY_EXISTS if a function name is taken.
  [[nodiscard]] absl::Status add_script(const std::string& source);

  // Runs `name` on `args` and `kwargs` after checking them against its
  // schema. A function that returns nothing gives None, several values a
  // tuple. Errors: NOT_FOUND naming an unknown function; INVALID_ARGUMENT
  // (from the schema check, naming the argument); UNKNOWN carrying the text
  // of an exception the function raised.
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
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<torch::jit::CompilationUnit>> units_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tether

#endif  // TETHER_CORE_CALLABLES_H_
