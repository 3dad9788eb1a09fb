#include "python/src/script.h"

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/callables.h"
#include "python/src/convert.h"
#include "python/src/status.h"

namespace tether::python {
namespace {

namespace py = pybind11;

// A scripted function as the callee runs it: a copy of its graph with its
// calls inlined and its RRef reads pointed at tether's operators, or none
// when it neither takes nor reads an RRef (torch's own call path serves it).
struct Routed {
  std::shared_ptr<torch::jit::CompilationUnit> unit;  // keeps `original` alive
  std::unique_ptr<torch::jit::GraphFunction> function;
};

bool mentions_rrefs(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::RRefType) return true;
  for (const c10::TypePtr& contained : type->containedTypes()) {
    if (mentions_rrefs(contained)) return true;
  }
  return false;
}

bool reads_rrefs(const torch::jit::Block* block) {
  static const c10::Symbol kToHere = c10::Symbol::aten("to_here");
  static const c10::Symbol kLocalValue = c10::Symbol::aten("local_value");
  for (const torch::jit::Node* node : block->nodes()) {
    if (node->kind() == kToHere || node->kind() == kLocalValue) return true;
    for (const torch::jit::Block* inner : node->blocks()) {
      if (reads_rrefs(inner)) return true;
    }
  }
  return false;
}

class RoutedScripts {
 public:
  // The routed form of `fn` (null when it needs none), made once.
  std::shared_ptr<const Routed> get(const torch::jit::StrongFunctionPtr& fn) {
    {
      absl::MutexLock lock(&mu_);
      auto it = routed_.find(fn.function_);
      if (it != routed_.end()) return it->second;
    }
    std::shared_ptr<Routed> routed = make(fn);
    absl::MutexLock lock(&mu_);
    return routed_.emplace(fn.function_, std::move(routed)).first->second;
  }

 private:
  static std::shared_ptr<Routed> make(const torch::jit::StrongFunctionPtr& fn) {
    torch::jit::GraphFunction* original =
        torch::jit::tryToGraphFunction(*fn.function_);
    if (original == nullptr) return nullptr;
    std::shared_ptr<torch::jit::Graph> graph = original->graph()->copy();
    torch::jit::Inline(*graph);
    bool takes_rrefs = false;
    for (const c10::Argument& a : original->getSchema().arguments()) {
      takes_rrefs |= mentions_rrefs(a.type());
    }
    if (!takes_rrefs && !reads_rrefs(graph->block())) return nullptr;
    rewrite_graph(*graph);
    auto routed = std::make_shared<Routed>();
    routed->unit = fn.cu_;
    routed->function = std::make_unique<torch::jit::GraphFunction>(
        original->qualname(), std::move(graph), nullptr);
    routed->function->setSchema(original->getSchema());
    return routed;
  }

  absl::Mutex mu_;
  // Scripted functions live as long as their compilation unit, which each
  // entry keeps.
  absl::flat_hash_map<const torch::jit::Function*, std::shared_ptr<Routed>>
      routed_ ABSL_GUARDED_BY(mu_);
};

RoutedScripts& routed_scripts() {
  static auto* scripts = new RoutedScripts();
  return *scripts;
}

// An argument as the function declares it: an RRef by tether, anything else
// by torch's conversion (as ScriptFunction.__call__ converts it).
c10::IValue argument(py::handle obj, const c10::Argument& declared,
                     const std::string& where) {
  if (mentions_rrefs(declared.type())) {
    return to_ivalue(obj, Objects::kRefuse, where);
  }
  return torch::jit::toIValue(obj, declared.type());
}

py::object call_script(const py::object& fn_object, const py::tuple& args,
                       const py::dict& kwargs) {
  const auto fn = py::cast<torch::jit::StrongFunctionPtr>(fn_object);
  std::shared_ptr<const Routed> routed = routed_scripts().get(fn);
  if (routed == nullptr) return fn_object(*args, **kwargs);
  const c10::FunctionSchema& schema = routed->function->getSchema();
  const std::vector<c10::Argument>& declared = schema.arguments();
  if (args.size() > declared.size()) {
    throw py::type_error(absl::StrCat(schema.name(), "() takes ",
                                      declared.size(), " arguments, ",
                                      args.size(), " given"));
  }
  std::vector<c10::IValue> stack;
  Kwargs named;
  for (size_t i = 0; i < args.size(); ++i) {
    stack.push_back(argument(args[i], declared[i],
                             absl::StrCat("argument '", declared[i].name(),
                                          "' of ", schema.name())));
  }
  for (const auto& [key, value] : kwargs) {
    const std::string name = py::cast<std::string>(key);
    const c10::Argument* match = nullptr;
    for (const c10::Argument& a : declared) {
      if (a.name() == name) match = &a;
    }
    if (match == nullptr) {
      throw py::type_error(absl::StrCat(schema.name(),
                                        "() got an unexpected keyword argument '",
                                        name, "'"));
    }
    named.emplace(name, argument(value, *match,
                                 absl::StrCat("argument '", name, "' of ",
                                              schema.name())));
  }
  absl::StatusOr<c10::IValue> result;
  {
    py::gil_scoped_release nogil;
    result = run_script_function(*routed->function, std::move(stack), named);
  }
  return to_python(value_or_throw(std::move(result)));
}

}  // namespace

void bind_script(py::module_& m) {
  m.def(
      "script_reads_rrefs",
      [](const py::object& fn) {
        return routed_scripts().get(
                   py::cast<torch::jit::StrongFunctionPtr>(fn)) != nullptr;
      },
      py::arg("fn"));
  m.def("call_script", &call_script, py::arg("fn"), py::arg("args"),
        py::arg("kwargs"));
}

}  // namespace tether::python
