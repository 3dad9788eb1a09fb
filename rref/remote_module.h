// RemoteModule: a torch::nn::Module made on another worker and used from
// here, like the peer's torch.distributed.nn.RemoteModule: forward() runs
// there, parameter_rrefs() gives the RRefs a DistributedOptimizer takes.
// No qualified class names: a module type is registered once per process
// by its C++ type, and created by the same type.
//
//   struct NetImpl : torch::nn::Module {
//     NetImpl(int64_t in, int64_t out) { fc = register_module(...); }
//     at::Tensor forward(const at::Tensor& x) { return fc(x); }
//     torch::nn::Linear fc{nullptr};
//   };
//
//   // In every process that may host one, before init_rpc: the
//   // constructor's parameter types, as peers will pass them.
//   TETHER_RETURN_IF_ERROR(tether::register_module<NetImpl, int64_t, int64_t>());
//   ...
//   TETHER_ASSIGN_OR_RETURN(tether::RemoteModule net,
//                           tether::RemoteModule::create<NetImpl>("ps", {4, 2}));
//   TETHER_ASSIGN_OR_RETURN(at::Tensor y, net.forward<at::Tensor>({x}));
//   TETHER_ASSIGN_OR_RETURN(std::vector<tether::RRef> params,
//                           net.parameter_rrefs());
//
// forward's arguments are converted and checked as a registered function's
// (core/native_function.h): INVALID_ARGUMENT naming the one that does not
// fit. Inside a distributed autograd context forward belongs to it, so
// backward reaches the module's parameters on their owner.
//
// Thread safety: a RemoteModule may be copied and used from any thread; the
// module's forward runs on its owner's pool, concurrently for concurrent
// callers (as LibTorch modules allow).
#ifndef TETHER_RREF_REMOTE_MODULE_H_
#define TETHER_RREF_REMOTE_MODULE_H_

#include <ATen/core/ivalue.h>
#include <absl/status/statusor.h>
#include <c10/util/Metaprogramming.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/native_function.h"
#include "core/typed_result.h"
#include "rref/rref.h"

namespace tether {

namespace internal {

// The name a module type is registered under: its C++ type's, as a
// callable name ("tether_module::" + "ns::NetImpl", other characters '_').
std::string module_function_name(const char* type_name);

// The value a module's RRef holds: `module` and its forward.
c10::IValue wrap_module(std::shared_ptr<torch::nn::Module> module,
                        NativeFunction forward);

// Registers the functions every hosting worker serves (forward,
// parameter_rrefs), once per process.
absl::Status register_module_functions();

template <typename M, typename R, typename... A>
NativeFunction forward_of(std::shared_ptr<M> module, R (*)(A...)) {
  return native_function([module](A... args) -> R {
    return module->forward(std::forward<A>(args)...);
  });
}

}  // namespace internal

// Makes module type M (a torch::nn::Module with one forward method)
// creatable on this process's workers from arguments of types Args...
// (M's constructor takes them). ALREADY_EXISTS if M is registered already.
template <typename M, typename... Args>
[[nodiscard]] absl::Status register_module() {
  if (absl::Status s = internal::register_module_functions(); !s.ok()) {
    return s;
  }
  return register_function(
      internal::module_function_name(c10::demangle_type<M>()),
      [](Args... args) -> c10::IValue {
        auto module = std::make_shared<M>(std::forward<Args>(args)...);
        using Forward =
            c10::guts::detail::strip_class_t<decltype(&M::forward)>;
        return internal::wrap_module(
            module,
            internal::forward_of(module, static_cast<Forward*>(nullptr)));
      });
}

class RemoteModule {
 public:
  // Creates a module of the type registered as `type_name` on `to` (by
  // the serving or default worker). Returns at once; a failed creation is
  // reported by the first call, or by module_rref().get_future().
  [[nodiscard]] static absl::StatusOr<RemoteModule> create(
      const To& to, const std::string& type_name,
      std::vector<c10::IValue> args, absl::Duration timeout = kDefaultTimeout);
  // The same from an explicit worker (several workers in one process).
  [[nodiscard]] static absl::StatusOr<RemoteModule> create(
      Worker& worker, const To& to, const std::string& type_name,
      std::vector<c10::IValue> args, absl::Duration timeout = kDefaultTimeout);

  template <typename M>
  [[nodiscard]] static absl::StatusOr<RemoteModule> create(
      const To& to, std::vector<c10::IValue> args,
      absl::Duration timeout = kDefaultTimeout) {
    return create(to, c10::demangle_type<M>(), std::move(args), timeout);
  }
  template <typename M>
  [[nodiscard]] static absl::StatusOr<RemoteModule> create(
      Worker& worker, const To& to, std::vector<c10::IValue> args,
      absl::Duration timeout = kDefaultTimeout) {
    return create(worker, to, c10::demangle_type<M>(), std::move(args),
                  timeout);
  }

  // The module's forward on its owner, called from the worker that
  // created this RemoteModule (or received it).
  Future<c10::IValue> forward_async(std::vector<c10::IValue> args,
                                    absl::Duration timeout =
                                        kDefaultTimeout) const;
  template <typename T = c10::IValue>
  [[nodiscard]] absl::StatusOr<T> forward(std::vector<c10::IValue> args,
                                          absl::Duration timeout =
                                              kDefaultTimeout) const {
    absl::StatusOr<c10::IValue> result =
        forward_async(std::move(args), timeout).get();
    if (!result.ok()) return result.status();
    return value_as<T>(*std::move(result), "the result of forward");
  }

  // RRefs to the module's parameters (owned by its worker), for a
  // DistributedOptimizer.
  [[nodiscard]] absl::StatusOr<std::vector<RRef>> parameter_rrefs(
      absl::Duration timeout = kDefaultTimeout) const;

  // The RRef to the module itself.
  const RRef& module_rref() const { return module_; }
  WorkerInfo owner() const { return module_.owner(); }

 private:
  explicit RemoteModule(RRef module) : module_(std::move(module)) {}
  RRef module_;
};

}  // namespace tether

#endif  // TETHER_RREF_REMOTE_MODULE_H_
