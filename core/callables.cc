#include "core/callables.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <absl/strings/str_cat.h>
#include <torch/custom_class.h>
#include <torch/jit.h>

#include <exception>
#include <optional>

namespace tether {
namespace {

// "ns::op.overload" -> {"ns::op", "overload"}; the overload may be empty.
c10::OperatorName split_operator_name(absl::string_view name) {
  size_t ns_end = name.find("::");
  size_t dot = name.find('.', ns_end == absl::string_view::npos ? 0 : ns_end);
  if (dot == absl::string_view::npos) {
    return c10::OperatorName(std::string(name), "");
  }
  return c10::OperatorName(std::string(name.substr(0, dot)),
                           std::string(name.substr(dot + 1)));
}

c10::IValue result_of(std::vector<c10::IValue>& stack) {
  if (stack.empty()) return c10::IValue();
  if (stack.size() == 1) return std::move(stack[0]);
  return c10::ivalue::Tuple::create(std::move(stack));
}

// The first line of an exception's text: c10::Error appends a C++ backtrace
// that helps nobody on the caller's side.
std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

absl::StatusOr<std::vector<c10::IValue>> check_inputs(
    const c10::FunctionSchema& schema, std::vector<c10::IValue> args,
    const Kwargs& kwargs) {
  try {
    schema.checkAndNormalizeInputs(args, kwargs);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad arguments for ", schema.operator_name().name,
        schema.overload_name().empty() ? "" : ".", schema.overload_name(),
        ": ", error_text(e)));
  }
  return args;
}

}  // namespace

// Runs `fn` on `stack` after checking it against the schema.
absl::StatusOr<c10::IValue> run_function(torch::jit::Function& fn,
                                         std::vector<c10::IValue> stack,
                                         const Kwargs& kwargs) {
  absl::StatusOr<std::vector<c10::IValue>> checked =
      check_inputs(fn.getSchema(), std::move(stack), kwargs);
  if (!checked.ok()) return checked.status();
  try {
    fn.run(*checked);
  } catch (const std::exception& e) {
    return absl::UnknownError(error_text(e));
  }
  return result_of(*checked);
}

absl::StatusOr<c10::IValue> Callables::call_method(
    const c10::IValue& self, absl::string_view method,
    std::vector<c10::IValue> args, const Kwargs& kwargs) {
  if (!self.isObject()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot call method '", method, "' on a ",
                     self.tagKind(), ": not an object of a custom class"));
  }
  c10::ClassTypePtr type = self.toObjectRef().type();
  torch::jit::Function* fn = type->findMethod(std::string(method));
  if (fn == nullptr) {
    return absl::NotFoundError(absl::StrCat("class ", type->repr_str(),
                                            " has no method '", method, "'"));
  }
  args.insert(args.begin(), self);
  return run_function(*fn, std::move(args), kwargs);
}

absl::Status Callables::add_script(const std::string& source) {
  std::shared_ptr<torch::jit::CompilationUnit> unit;
  try {
    unit = torch::jit::compile(source);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("TorchScript source does not compile: ", error_text(e)));
  }
  absl::MutexLock lock(&mu_);
  for (const torch::jit::Function* fn : unit->get_functions()) {
    for (const auto& existing : units_) {
      if (existing->find_function(fn->qualname()) != nullptr) {
        return absl::AlreadyExistsError(absl::StrCat(
            "a TorchScript function named '", fn->qualname().qualifiedName(),
            "' is already registered"));
      }
    }
  }
  units_.push_back(std::move(unit));
  return absl::OkStatus();
}

absl::StatusOr<c10::IValue> Callables::call(absl::string_view name,
                                            std::vector<c10::IValue> args,
                                            const Kwargs& kwargs) const {
  if (name.find("::") != absl::string_view::npos) {
    c10::optional<c10::OperatorHandle> op =
        c10::Dispatcher::singleton().findOp(split_operator_name(name));
    if (op.has_value() && op->hasSchema()) {
      absl::StatusOr<std::vector<c10::IValue>> stack =
          check_inputs(op->schema(), std::move(args), kwargs);
      if (!stack.ok()) return stack.status();
      try {
        op->callBoxed(&*stack);
      } catch (const std::exception& e) {
        return absl::UnknownError(error_text(e));
      }
      return result_of(*stack);
    }
  }
  // A custom class, by its qualified name: construct an instance.
  if (c10::ClassTypePtr type = torch::getCustomClass(std::string(name))) {
    torch::jit::Function* init = type->findMethod("__init__");
    if (init == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("class ", name, " has no constructor (torch::init)"));
    }
    // A custom class keeps its C++ object in one slot, set by __init__.
    c10::IValue self(c10::ivalue::Object::create(
        c10::StrongTypePtr(nullptr, type), /*numSlots=*/1));
    args.insert(args.begin(), self);
    absl::StatusOr<c10::IValue> constructed =
        run_function(*init, std::move(args), kwargs);
    if (!constructed.ok()) return constructed.status();
    return self;
  }
  torch::jit::Function* fn = nullptr;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& unit : units_) {
      fn = unit->find_function(c10::QualifiedName(std::string(name)));
      if (fn != nullptr) break;
    }
  }
  if (fn == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "no operator or TorchScript function named '", name, "'"));
  }
  return run_function(*fn, std::move(args), kwargs);
}

}  // namespace tether
