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
// Also callable: LibTorch's TorchScript-only operators of a short list of
// pure ones (script_operators(): "prim::min", "aten::len"), and under their bare names the Python builtins the peer's
// examples call ("min", "max", "abs", "sum", "len", ...: kBuiltinAliases),
// which name those operators; and the C++ functions and lambdas registered
// with add_function (Worker::register_function, tether::register_function;
// core/native_function.h makes one from a plain C++ callable).
//
// A function may answer later: one whose result is a c10::ivalue::Future
// (core/ivalue_future.h makes one from a tether Future) is served when that
// future completes, without holding a pool thread meanwhile (the peer's
// @rpc.functions.async_execution); see Worker.
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

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <absl/base/thread_annotations.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace torch::jit {
struct CompilationUnit;
struct Function;
struct Graph;
}  // namespace torch::jit

namespace tether {

using Kwargs = std::unordered_map<std::string, c10::IValue>;

// Keyword arguments as a call message carries them: None when there are
// none (most calls: no dict is built on either side), else a
// Dict[str, Any].
c10::IValue kwargs_to_wire(Kwargs kwargs);
// Whether `value` has a shape kwargs_to_wire() gives.
bool is_wire_kwargs(const c10::IValue& value);

// A rewrite of the TorchScript graphs tether runs, registered by a layer
// above core, process-wide as the operators it points at (e.g. nodes of
// LibTorch's operators pointed at a layer's own operators of the same
// names). It changes `graph` in place: its nested blocks too, not the
// functions it calls.
using GraphRewrite = void (*)(torch::jit::Graph& graph);
// Adds `rewrite` to those rewrite_graph() applies; returns true, so that a
// layer registers it at static initialisation
// (`const bool kAdded = register_graph_rewrite(...)`).
bool register_graph_rewrite(GraphRewrite rewrite);
// Applies every registered rewrite to `graph`, in the order registered.
// add_script() does it to every function it compiles; a front end that runs
// scripted functions of its own does it to their graphs.
void rewrite_graph(torch::jit::Graph& graph);

// Runs TorchScript function `fn` on `args` and `kwargs` after checking them
// against its schema (an argument declared RRef[T] takes any RRef: see
// callables.cc), as call() runs the functions of add_script(). Errors as
// call()'s.
[[nodiscard]] absl::StatusOr<c10::IValue> run_script_function(
    torch::jit::Function& fn, std::vector<c10::IValue> args,
    const Kwargs& kwargs);
// The keyword arguments of `value` (is_wire_kwargs()): INVALID_ARGUMENT
// "keyword argument names must be strings" for a key that is not one.
[[nodiscard]] absl::StatusOr<Kwargs> kwargs_from_wire(const c10::IValue& value);

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

// A C++ function peers may call by name. With a schema, the arguments are
// checked against it (and defaults filled in) before `run` gets them in
// schema order with no kwargs; without one, `run` gets them as they came.
// `run` may return a c10::ivalue::Future (see above); an error it returns
// reaches the caller with its code; an exception it throws is UNKNOWN
// carrying its text.
struct NativeFunction {
  std::optional<c10::FunctionSchema> schema;
  std::function<absl::StatusOr<c10::IValue>(std::vector<c10::IValue> args,
                                            const Kwargs& kwargs)>
      run;
};

// Runs `fn` (named `name` in errors) as a Callables serves it: arguments
// checked against its schema first (INVALID_ARGUMENT naming the one that
// does not fit), an exception it throws is UNKNOWN with its text.
[[nodiscard]] absl::StatusOr<c10::IValue> call_function(
    const NativeFunction& fn, absl::string_view name,
    std::vector<c10::IValue> args, const Kwargs& kwargs);

// The TorchScript-only operators peers may call: pure ones on numbers,
// strings and lists ("prim::min", "aten::len", the int and float overloads
// of "aten::add" ...). The interpreter's others are not callable: some
// write files (aten::save) or need the interpreter's own state.
const std::vector<std::string>& script_operators();

// Python builtin name -> the LibTorch operator it stands for ("min" ->
// "prim::min"), as TorchScript maps them.
const std::vector<std::pair<std::string, std::string>>& builtin_aliases();

// Registers `fn` under `name` for every Worker of this process (each
// Worker's own functions, Worker::register_function, come first). Errors as
// Callables::add_function. Register before init_rpc so that no peer calls
// the name before it exists.
[[nodiscard]] absl::Status register_function(std::string name,
                                             NativeFunction fn);

class Callables {
 public:
  // Serves `fn` under `name`: a plain name ("my_add") or one with a
  // namespace ("myns::my_add"). INVALID_ARGUMENT for an empty name, one
  // with characters other than letters, digits, '_', '.' and "::", or one
  // that names a LibTorch operator or builtin; ALREADY_EXISTS if taken.
  [[nodiscard]] absl::Status add_function(std::string name, NativeFunction fn);

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
  // An operator overload: a dispatcher operator, or a TorchScript-only
  // one (prim::, and aten:: operators only TorchScript has).
  struct Overload;
  // The overloads of a bare operator name ("aten::add"), cached.
  std::shared_ptr<const std::vector<Overload>> overloads(
      const std::string& name) const;
  // `name`'s native function (this object's, else the process's), or null.
  std::shared_ptr<const NativeFunction> function(absl::string_view name) const;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<torch::jit::CompilationUnit>> units_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::shared_ptr<CallableProvider>>>
      providers_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::shared_ptr<const NativeFunction>>
      functions_ ABSL_GUARDED_BY(mu_);
  mutable std::unordered_map<std::string,
                             std::shared_ptr<const std::vector<Overload>>>
      overloads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tether

#endif  // TETHER_CORE_CALLABLES_H_
