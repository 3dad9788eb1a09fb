#include "rref/remote_module.h"

#include <absl/strings/str_cat.h>
#include <torch/custom_class.h>

#include <cctype>
#include <mutex>

#include "core/ivalue_future.h"
#include "core/rpc.h"
#include "rref/module_state.h"
#include "rref/rref_impl.h"

namespace tether {
namespace {

constexpr char kPrefix[] = "tether_module::";
constexpr char kForward[] = "tether_module.forward";
constexpr char kParameters[] = "tether_module.parameter_rrefs";

// What a module's RRef holds on its owner.
struct ModuleHolder : torch::CustomClassHolder {
  std::shared_ptr<torch::nn::Module> module;
  NativeFunction forward;
};

// state_dict() and load_state_dict(state): what a checkpoint calls on the
// owner (tether/checkpoint.h).
TORCH_LIBRARY(tether_remote_module, m) {
  m.class_<ModuleHolder>("Module")
      .def("state_dict",
           [](const c10::intrusive_ptr<ModuleHolder>& self) {
             return module_state_dict(*self->module);
           })
      .def("load_state_dict",
           [](const c10::intrusive_ptr<ModuleHolder>& self,
              const c10::Dict<std::string, at::Tensor>& state) {
             absl::Status loaded = load_module_state_dict(*self->module, state);
             if (!loaded.ok()) throw StatusError(loaded);
           });
}

// The module that args[0], an RRef owned by this worker, holds.
absl::StatusOr<c10::intrusive_ptr<ModuleHolder>> module_of(
    const std::vector<c10::IValue>& args, absl::string_view what) {
  if (args.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " takes the module's RRef first"));
  }
  absl::StatusOr<RRef> rref = RRef::from_ivalue(args[0]);
  if (!rref.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", rref.status().message()));
  }
  absl::StatusOr<c10::IValue> value = rref->local_value();
  if (!value.ok()) return value.status();
  if (!value->isCustomClass() ||
      value->type() != c10::getCustomClassType<
                           c10::intrusive_ptr<ModuleHolder>>()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the RRef holds a ", value->type()->str(), ", not a module"));
  }
  return value->toCustomClass<ModuleHolder>();
}

}  // namespace

namespace internal {

std::string module_function_name(const char* type_name) {
  std::string name = kPrefix;
  for (const char* c = type_name; *c != '\0'; ++c) {
    if (*c == ':' && c[1] == ':') {
      name += "::";
      ++c;
    } else {
      name += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
    }
  }
  return name;
}

c10::IValue wrap_module(std::shared_ptr<torch::nn::Module> module,
                        NativeFunction forward) {
  auto holder = c10::make_intrusive<ModuleHolder>();
  holder->module = std::move(module);
  holder->forward = std::move(forward);
  return c10::IValue(std::move(holder));
}

absl::Status register_module_functions() {
  static absl::Status* registered = [] {
    auto* status = new absl::Status();
    NativeFunction forward;
    forward.run = [](std::vector<c10::IValue> args,
                     const Kwargs& kwargs) -> absl::StatusOr<c10::IValue> {
      absl::StatusOr<c10::intrusive_ptr<ModuleHolder>> holder =
          module_of(args, "forward");
      if (!holder.ok()) return holder.status();
      args.erase(args.begin());
      return call_function((*holder)->forward, "forward", std::move(args),
                           kwargs);
    };
    NativeFunction parameters;
    parameters.run = [](std::vector<c10::IValue> args,
                        const Kwargs&) -> absl::StatusOr<c10::IValue> {
      absl::StatusOr<c10::intrusive_ptr<ModuleHolder>> holder =
          module_of(args, "parameter_rrefs");
      if (!holder.ok()) return holder.status();
      c10::impl::GenericList out(c10::AnyType::get());
      for (const at::Tensor& p : (*holder)->module->parameters()) {
        absl::StatusOr<RRef> r = RRef::local(p);
        if (!r.ok()) return r.status();
        out.push_back(r->to_ivalue());
      }
      return c10::IValue(std::move(out));
    };
    *status = register_function(kForward, std::move(forward));
    if (status->ok()) {
      *status = register_function(kParameters, std::move(parameters));
    }
    return status;
  }();
  return *registered;
}

}  // namespace internal

absl::StatusOr<RemoteModule> RemoteModule::create(
    const To& to, const std::string& type_name, std::vector<c10::IValue> args,
    absl::Duration timeout) {
  Worker* worker = current_worker();
  if (worker == nullptr) {
    return absl::FailedPreconditionError(
        "RemoteModule::create needs a worker: call init_rpc first");
  }
  return create(*worker, to, type_name, std::move(args), timeout);
}

absl::StatusOr<RemoteModule> RemoteModule::create(
    Worker& worker, const To& to, const std::string& type_name,
    std::vector<c10::IValue> args, absl::Duration timeout) {
  absl::StatusOr<RRef> module =
      remote(worker, to, internal::module_function_name(type_name.c_str()),
             std::move(args), {}, timeout);
  if (!module.ok()) return module.status();
  return RemoteModule(*std::move(module));
}

Future<c10::IValue> RemoteModule::forward_async(std::vector<c10::IValue> args,
                                                absl::Duration timeout) const {
  args.insert(args.begin(), module_.to_ivalue());
  return rref::rpc_async_to_owner(module_, kForward, std::move(args), timeout);
}

absl::StatusOr<std::vector<RRef>> RemoteModule::parameter_rrefs(
    absl::Duration timeout) const {
  absl::StatusOr<c10::IValue> list =
      rref::rpc_async_to_owner(module_, kParameters, {module_.to_ivalue()},
                               timeout)
          .get();
  if (!list.ok()) return list.status();
  std::vector<RRef> out;
  for (const c10::IValue& v : list->toListRef()) {
    absl::StatusOr<RRef> r = RRef::from_ivalue(v);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

}  // namespace tether
