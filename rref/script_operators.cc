// TorchScript's RRef methods on tether's RRefs.
//
// TorchScript compiles `r.to_here()`, `r.local_value()`, `r.owner_name()`,
// `r.is_owner()` and `r.confirmed_by_owner()` of an `RRef[T]` to operators
// of those names under aten::. LibTorch's C++ library does not define them;
// the peer's libtorch_python does, and its to_here and local_value cast the
// RRef to the peer's own classes (a tether RRef is not one of them: the
// cast would crash). So:
//
// - tether::to_here and tether::local_value serve tether's RRefs, and every
//   TorchScript function tether runs has its aten::to_here and
//   aten::local_value nodes pointed at them (route_rref_methods, a graph
//   rewrite of core/callables.h: at Callables::add_script, and in the
//   Python front end before it runs a scripted function);
// - in a process without the peer's operators (a C++ program), the five
//   aten:: names are registered here too, with tether's implementations,
//   so that scripts that call them compile. In a Python process they are
//   the peer's already (torch is loaded before tether), and the three that
//   only ask the RRef's interface (owner_name, is_owner,
//   confirmed_by_owner) work on tether's RRefs as they are.
//
// A timeout of to_here below zero is the worker's default and zero no bound,
// as RRef.to_here(timeout) in Python.
#include <ATen/core/stack.h>
#include <absl/strings/str_cat.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/callables.h"
#include "rref/rref.h"

namespace tether {
namespace {

using torch::jit::Stack;

RRef rref_of(const c10::IValue& value, const char* method) {
  absl::StatusOr<RRef> rref = RRef::from_ivalue(value);
  if (!rref.ok()) {
    throw std::runtime_error(absl::StrCat(
        "RRef.", method, "() in TorchScript: ", rref.status().message()));
  }
  return *std::move(rref);
}

absl::Duration timeout_of(double seconds) {
  if (seconds < 0) return kDefaultTimeout;
  if (seconds == 0) return absl::ZeroDuration();
  return absl::Seconds(seconds);
}

c10::IValue value_or_throw(absl::StatusOr<c10::IValue> value) {
  if (!value.ok()) throw std::runtime_error(value.status().ToString());
  return *std::move(value);
}

// The value an RRef gave, checked against the type the function's graph
// declared for it (a user RRef's type is Any until its value is fetched).
c10::IValue checked(c10::IValue value, const c10::TypePtr& expected,
                    const char* method) {
  if (expected != nullptr && !value.type()->isSubtypeOf(*expected)) {
    throw std::runtime_error(absl::StrCat(
        "RRef.", method, "() in TorchScript gave a ",
        value.type()->annotation_str(), " where the function declares RRef[",
        expected->annotation_str(), "]"));
  }
  return value;
}

c10::TypePtr expected_of(const torch::jit::Node* node) {
  return node != nullptr && node->outputs().size() == 1
             ? node->output()->type()
             : nullptr;
}

torch::jit::Operation to_here(const torch::jit::Node* node) {
  return [expected = expected_of(node)](Stack& stack) {
    const double timeout = torch::jit::pop(stack).toDouble();
    const RRef rref = rref_of(torch::jit::pop(stack), "to_here");
    torch::jit::push(
        stack, checked(value_or_throw(rref.to_here(timeout_of(timeout))),
                       expected, "to_here"));
  };
}

torch::jit::Operation local_value(const torch::jit::Node* node) {
  return [expected = expected_of(node)](Stack& stack) {
    const RRef rref = rref_of(torch::jit::pop(stack), "local_value");
    torch::jit::push(stack, checked(value_or_throw(rref.local_value()),
                                    expected, "local_value"));
  };
}

torch::jit::Operation owner_name(const torch::jit::Node*) {
  return [](Stack& stack) {
    torch::jit::push(
        stack, rref_of(torch::jit::pop(stack), "owner_name").owner_name());
  };
}

torch::jit::Operation is_owner(const torch::jit::Node*) {
  return [](Stack& stack) {
    torch::jit::push(stack,
                     rref_of(torch::jit::pop(stack), "is_owner").is_owner());
  };
}

torch::jit::Operation confirmed_by_owner(const torch::jit::Node*) {
  return [](Stack& stack) {
    torch::jit::push(stack,
                     rref_of(torch::jit::pop(stack), "confirmed_by_owner")
                         .confirmed_by_owner());
  };
}

struct Method {
  const char* name;
  const char* signature;  // after the name
  torch::jit::Operation (*make)(const torch::jit::Node*);
  bool routed;  // tether:: too (route_rref_methods points aten:: here)
};

constexpr Method kMethods[] = {
    {"to_here", "(RRef(t) self, float timeout=-1.) -> t(*)", &to_here, true},
    {"local_value", "(RRef(t) self) -> t(*)", &local_value, true},
    {"owner_name", "(RRef(t) self) -> str", &owner_name, false},
    {"is_owner", "(RRef(t) self) -> bool", &is_owner, false},
    {"confirmed_by_owner", "(RRef(t) self) -> bool", &confirmed_by_owner,
     false},
};

void register_operator(const std::string& name, const Method& method) {
  torch::jit::registerOperator(torch::jit::Operator(
      name + method.signature, torch::jit::OperationCreator(method.make),
      c10::AliasAnalysisKind::FROM_SCHEMA));
}

void route_rref_methods(torch::jit::Block* block) {
  static const c10::Symbol kToHere = c10::Symbol::aten("to_here");
  static const c10::Symbol kLocalValue = c10::Symbol::aten("local_value");
  static const c10::Symbol kTetherToHere =
      c10::Symbol::fromQualString("tether::to_here");
  static const c10::Symbol kTetherLocalValue =
      c10::Symbol::fromQualString("tether::local_value");
  std::vector<torch::jit::Node*> routed;
  for (torch::jit::Node* node : block->nodes()) {
    for (torch::jit::Block* inner : node->blocks()) route_rref_methods(inner);
    if (node->kind() == kToHere || node->kind() == kLocalValue) {
      routed.push_back(node);
    }
  }
  for (torch::jit::Node* node : routed) {
    node->replaceWithNewSymbol(node->kind() == kToHere ? kTetherToHere
                                                       : kTetherLocalValue);
    node->destroy();
  }
}

// Points every aten::to_here and aten::local_value node of `graph` (its
// nested blocks too) at tether's operators of the same names.
void route_rref_methods(torch::jit::Graph& graph) {
  route_rref_methods(graph.block());
}

const bool kRouted = register_graph_rewrite(&route_rref_methods);

const bool kRegistered = [] {
  for (const Method& method : kMethods) {
    if (method.routed) {
      register_operator(absl::StrCat("tether::", method.name), method);
    }
    const std::string aten = absl::StrCat("aten::", method.name);
    if (torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(aten))
            .empty()) {
      register_operator(aten, method);
    }
  }
  return true;
}();

}  // namespace
}  // namespace tether
