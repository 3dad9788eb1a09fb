#include "core/callables.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/custom_class.h>
#include <torch/jit.h>

#include <cctype>
#include <exception>
#include <optional>
#include <sstream>

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

// Operators that would let a peer read or write this worker's files.
bool refused_operator(const c10::OperatorName& name) {
  return name.name == "aten::from_file";
}

absl::Status refusal(const c10::OperatorName& name) {
  return absl::PermissionDeniedError(absl::StrCat(
      "operator ", name.name, " is refused: it reads or writes the callee's "
      "files (docs/security.md)"));
}

std::string type_name(const c10::IValue& v) {
  if (v.isTensor()) return "Tensor";
  if (v.isList()) {
    return absl::StrCat(v.toList().elementType()->annotation_str(), "[]");
  }
  return v.type()->annotation_str();
}

// Whether `v` can be passed where `type` is declared; adds to `cost` one per
// conversion (a number passed as Scalar, a value as Any or a type variable,
// a tuple as a list) and rewrites an empty list or a tuple to a list of the
// declared element type.
bool accepts(c10::IValue& v, const c10::TypePtr& type, int& cost) {
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return v.isTensor();
    case c10::TypeKind::OptionalType:
      return v.isNone() ||
             accepts(v, type->expectRef<c10::OptionalType>().getElementType(),
                     cost);
    case c10::TypeKind::NumberType:
      ++cost;
      return v.isInt() || v.isDouble() || v.isComplexDouble();
    case c10::TypeKind::IntType:
      return v.isInt();
    case c10::TypeKind::FloatType:
      return v.isDouble();
    case c10::TypeKind::BoolType:
      return v.isBool();
    case c10::TypeKind::StringType:
      return v.isString();
    case c10::TypeKind::ComplexType:
      return v.isComplexDouble();
    case c10::TypeKind::AnyType:
    case c10::TypeKind::VarType:
      ++cost;
      return true;
    case c10::TypeKind::ListType: {
      const c10::TypePtr& element =
          type->expectRef<c10::ListType>().getElementType();
      if (v.isTuple()) {
        // A tuple where a list is declared (torch.stack((a, b))), as
        // Python's torch takes it: a list of the declared element type if
        // every element fits one.
        c10::impl::GenericList list(element);
        for (c10::IValue e : v.toTupleRef().elements()) {
          if (!accepts(e, element, cost)) return false;
          list.push_back(std::move(e));
        }
        ++cost;
        v = std::move(list);
        return true;
      }
      if (!v.isList()) return false;
      if (element->hasFreeVariables()) {
        ++cost;
        return true;
      }
      c10::impl::GenericList list = v.toList();
      if (list.empty()) {
        if (*list.elementType() != *element) {
          v = c10::impl::GenericList(element);
        }
        return true;
      }
      return list.elementType()->isSubtypeOf(*element);
    }
    default:
      if (type->hasFreeVariables()) {
        ++cost;
        return true;
      }
      return v.type()->isSubtypeOf(*type);
  }
}

// An INVALID_ARGUMENT saying `why()`, or with no message unless `explain`:
// a bare name tries every overload on each call, and the texts of those
// that do not fit (schemas and types printed) cost more than the call.
template <typename Why>
absl::Status misfit(bool explain, Why why) {
  return absl::InvalidArgumentError(explain ? why() : std::string());
}

// The stack that calls `schema` with `args` and `kwargs` (defaults filled
// in), or why they do not fit (if `explain`); `cost` counts the
// conversions.
absl::StatusOr<std::vector<c10::IValue>> fit(const c10::FunctionSchema& schema,
                                             std::vector<c10::IValue> args,
                                             const Kwargs& kwargs, int& cost,
                                             bool explain = true) {
  const std::vector<c10::Argument>& formals = schema.arguments();
  if (schema.is_vararg()) {
    return misfit(explain,
                  [] { return std::string("takes variadic arguments"); });
  }
  size_t positional = 0;
  while (positional < formals.size() && !formals[positional].kwarg_only()) {
    ++positional;
  }
  if (args.size() > positional) {
    return misfit(explain, [&] {
      return absl::StrCat("takes ", positional, " positional arguments, got ",
                          args.size());
    });
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (!accepts(args[i], formals[i].type(), cost)) {
      return misfit(explain, [&] {
        return absl::StrCat("argument '", formals[i].name(), "' (position ", i,
                            ") must be ", formals[i].type()->annotation_str(),
                            ", got ", type_name(args[i]));
      });
    }
  }
  const size_t given = args.size();
  size_t used = 0;
  for (size_t i = given; i < formals.size(); ++i) {
    const c10::Argument& formal = formals[i];
    auto keyword = kwargs.find(formal.name());
    if (keyword != kwargs.end()) {
      c10::IValue value = keyword->second;
      if (!accepts(value, formal.type(), cost)) {
        return misfit(explain, [&] {
          return absl::StrCat("argument '", formal.name(), "' must be ",
                              formal.type()->annotation_str(), ", got ",
                              type_name(value));
        });
      }
      args.push_back(std::move(value));
      ++used;
    } else if (formal.default_value().has_value()) {
      args.push_back(*formal.default_value());
    } else {
      return misfit(explain, [&] {
        return absl::StrCat("missing argument '", formal.name(), "'");
      });
    }
  }
  if (used != kwargs.size()) {
    for (const auto& entry : kwargs) {
      for (size_t i = 0; i < given; ++i) {
        if (formals[i].name() == entry.first) {
          return misfit(explain, [&] {
            return absl::StrCat("argument '", entry.first,
                                "' given by position and keyword");
          });
        }
      }
    }
    for (const auto& entry : kwargs) {
      if (!schema.argumentIndexWithName(entry.first).has_value()) {
        return misfit(explain, [&] {
          return absl::StrCat("unexpected keyword argument '", entry.first,
                              "'");
        });
      }
    }
  }
  return args;
}

std::string schema_text(const c10::FunctionSchema& schema) {
  std::ostringstream out;
  out << schema;
  return out.str();
}

// The processwide functions of register_function.
struct GlobalFunctions {
  absl::Mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const NativeFunction>>
      functions ABSL_GUARDED_BY(mu);
};

GlobalFunctions& global_functions() {
  static auto* functions = new GlobalFunctions();  // never destroyed
  return *functions;
}

bool valid_function_name(absl::string_view name) {
  if (name.empty() || absl::StartsWith(name, ":") ||
      absl::EndsWith(name, ":")) {
    return false;
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.') {
      continue;
    }
    if (c == ':' && i + 1 < name.size() && name[i + 1] == ':') {
      ++i;
      continue;
    }
    return false;
  }
  return true;
}

// Runs `op` (a dispatcher operator) or else `jit` (a TorchScript-only one)
// on a stack that fits its schema.
absl::StatusOr<c10::IValue> run_operator(const c10::OperatorHandle* op,
                                         const torch::jit::Operator* jit,
                                         std::vector<c10::IValue> stack) {
  try {
    if (op != nullptr) {
      op->callBoxed(&stack);
    } else {
      torch::jit::Operation operation = jit->getOperation();
      operation(stack);
    }
  } catch (const std::exception& e) {
    return absl::UnknownError(error_text(e));
  }
  return result_of(stack);
}

}  // namespace

struct Callables::Overload {
  c10::FunctionSchema schema;
  std::optional<c10::OperatorHandle> op;      // a dispatcher operator
  std::shared_ptr<torch::jit::Operator> jit;  // else a TorchScript-only one

  absl::StatusOr<c10::IValue> call(std::vector<c10::IValue> stack) const {
    return run_operator(op.has_value() ? &*op : nullptr, jit.get(),
                        std::move(stack));
  }
};

const std::vector<std::pair<std::string, std::string>>& builtin_aliases() {
  static const auto* aliases =
      new std::vector<std::pair<std::string, std::string>>{
          {"min", "prim::min"},   {"max", "prim::max"},
          {"abs", "prim::abs"},   {"sum", "aten::sum"},
          {"len", "aten::len"},   {"pow", "aten::pow"},
          {"round", "aten::round"}, {"divmod", "aten::divmod"},
          {"float", "aten::Float"}, {"int", "aten::Int"},
          {"bool", "aten::Bool"}, {"str", "aten::str"},
      };
  return *aliases;
}

const std::vector<std::string>& script_operators() {
  static const auto* allowed = new std::vector<std::string>{
      "prim::min",     "prim::max",     "prim::abs",      "aten::len",
      "aten::sum",     "aten::pow",     "aten::round",    "aten::divmod",
      "aten::Float",   "aten::Int",     "aten::Bool",     "aten::str",
      "aten::add",     "aten::sub",     "aten::mul",      "aten::div",
      "aten::floordiv", "aten::remainder", "aten::neg",   "aten::floor",
      "aten::ceil",    "aten::sqrt",    "aten::log",      "aten::exp",
  };
  return *allowed;
}

namespace {

bool script_operator_allowed(absl::string_view name) {
  for (const std::string& allowed : script_operators()) {
    if (allowed == name) return true;
  }
  return false;
}

std::optional<std::string> alias_of(absl::string_view name) {
  for (const auto& [builtin, op] : builtin_aliases()) {
    if (builtin == name) return op;
  }
  return std::nullopt;
}

}  // namespace

c10::IValue kwargs_to_wire(Kwargs kwargs) {
  if (kwargs.empty()) return c10::IValue();
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.reserve(kwargs.size());
  for (auto& [key, value] : kwargs) dict.insert(key, std::move(value));
  return c10::IValue(std::move(dict));
}

bool is_wire_kwargs(const c10::IValue& value) {
  return value.isNone() || value.isGenericDict();
}

absl::StatusOr<Kwargs> kwargs_from_wire(const c10::IValue& value) {
  Kwargs kwargs;
  if (value.isNone()) return kwargs;
  if (!value.isGenericDict()) {
    return absl::InvalidArgumentError(
        "keyword arguments must be a dict or None");
  }
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString()) {
      return absl::InvalidArgumentError(
          "keyword argument names must be strings");
    }
    kwargs.emplace(entry.key().toStringRef(), entry.value());
  }
  return kwargs;
}

absl::Status register_function(std::string name, NativeFunction fn) {
  Callables probe;  // the same checks as a Worker's own functions
  if (absl::Status s = probe.add_function(name, fn); !s.ok()) return s;
  GlobalFunctions& global = global_functions();
  absl::MutexLock lock(&global.mu);
  if (!global.functions
           .emplace(name, std::make_shared<NativeFunction>(std::move(fn)))
           .second) {
    return absl::AlreadyExistsError(absl::StrCat(
        "a function named '", name, "' is already registered in this process"));
  }
  return absl::OkStatus();
}

absl::Status Callables::add_function(std::string name, NativeFunction fn) {
  if (!valid_function_name(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot register a function named '", name,
        "': use letters, digits, '_', '.' and '::' between names"));
  }
  if (!fn.run) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot register '", name, "': no function given"));
  }
  if (alias_of(name).has_value() ||
      !overloads(split_operator_name(name).name)->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot register a function named '", name,
        "': that name is a LibTorch operator or builtin"));
  }
  absl::MutexLock lock(&mu_);
  if (!functions_
           .emplace(name, std::make_shared<NativeFunction>(std::move(fn)))
           .second) {
    return absl::AlreadyExistsError(
        absl::StrCat("a function named '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

std::shared_ptr<const NativeFunction> Callables::function(
    absl::string_view name) const {
  const std::string key(name);
  {
    absl::MutexLock lock(&mu_);
    auto it = functions_.find(key);
    if (it != functions_.end()) return it->second;
  }
  GlobalFunctions& global = global_functions();
  absl::MutexLock lock(&global.mu);
  auto it = global.functions.find(key);
  if (it != global.functions.end()) return it->second;
  return nullptr;
}

absl::StatusOr<c10::IValue> call_function(const NativeFunction& fn,
                                          absl::string_view name,
                                          std::vector<c10::IValue> args,
                                          const Kwargs& kwargs) {
  Kwargs none;
  const Kwargs* given = &kwargs;
  if (fn.schema.has_value()) {
    int cost = 0;
    absl::StatusOr<std::vector<c10::IValue>> stack =
        fit(*fn.schema, std::move(args), kwargs, cost);
    if (!stack.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad arguments for ", name, ": ", stack.status().message(),
          "; it takes (",
          absl::StrJoin(fn.schema->arguments(), ", ",
                        [](std::string* out, const c10::Argument& a) {
                          absl::StrAppend(out, a.type()->annotation_str());
                        }),
          ")"));
    }
    args = *std::move(stack);
    given = &none;
  }
  try {
    return fn.run(std::move(args), *given);
  } catch (const std::exception& e) {
    return absl::UnknownError(error_text(e));
  }
}

namespace {

// A tether RRef's type is its value's only where the value was made
// (RRef::local); elsewhere it is RRef[Any]: a user learns its value's type
// by fetching it. So where a function declares an argument RRef[T], any
// RRef is taken (the schema is checked with Any there, then the argument
// must be an RRef; inside a container, as List[RRef[T]], Any), and the
// value's type is checked when to_here() or local_value() gives it
// (rref/script_operators.cc).
// `type` with every RRef[T] in it (List[RRef[T]] too) made Any.
c10::TypePtr without_rrefs(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::RRefType) return c10::AnyType::get();
  const c10::ArrayRef<c10::TypePtr> contained = type->containedTypes();
  if (contained.empty()) return type;
  std::vector<c10::TypePtr> relaxed;
  bool changed = false;
  for (const c10::TypePtr& t : contained) {
    relaxed.push_back(without_rrefs(t));
    changed |= relaxed.back() != t;
  }
  return changed ? type->withContained(std::move(relaxed)) : type;
}

absl::StatusOr<std::vector<c10::IValue>> check_function_inputs(
    const c10::FunctionSchema& schema, std::vector<c10::IValue> stack,
    const Kwargs& kwargs) {
  const std::vector<c10::Argument>& declared = schema.arguments();
  std::vector<c10::Argument> relaxed;
  bool takes_rrefs = false;
  for (const c10::Argument& argument : declared) {
    c10::TypePtr type = without_rrefs(argument.type());
    takes_rrefs |= type != argument.type();
    relaxed.push_back(argument.cloneWithType(std::move(type)));
  }
  if (!takes_rrefs) return check_inputs(schema, std::move(stack), kwargs);
  absl::StatusOr<std::vector<c10::IValue>> checked = check_inputs(
      schema.cloneWithArguments(std::move(relaxed)), std::move(stack), kwargs);
  if (!checked.ok()) return checked.status();
  for (size_t i = 0; i < declared.size() && i < checked->size(); ++i) {
    if (declared[i].type()->kind() == c10::TypeKind::RRefType &&
        !(*checked)[i].isRRef()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad arguments for ", schema.name(), ": argument '",
          declared[i].name(), "' is declared ",
          declared[i].type()->annotation_str(), " but got a ",
          type_name((*checked)[i])));
    }
  }
  return checked;
}

}  // namespace

absl::StatusOr<c10::IValue> run_script_function(torch::jit::Function& fn,
                                                std::vector<c10::IValue> stack,
                                                const Kwargs& kwargs) {
  absl::StatusOr<std::vector<c10::IValue>> checked =
      check_function_inputs(fn.getSchema(), std::move(stack), kwargs);
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
  return run_script_function(*fn, std::move(args), kwargs);
}

namespace {

struct GraphRewrites {
  absl::Mutex mu;
  std::vector<GraphRewrite> rewrites ABSL_GUARDED_BY(mu);
};

GraphRewrites& graph_rewrites() {
  static auto* rewrites = new GraphRewrites();
  return *rewrites;
}

}  // namespace

bool register_graph_rewrite(GraphRewrite rewrite) {
  GraphRewrites& all = graph_rewrites();
  absl::MutexLock lock(&all.mu);
  all.rewrites.push_back(rewrite);
  return true;
}

void rewrite_graph(torch::jit::Graph& graph) {
  std::vector<GraphRewrite> rewrites;
  {
    GraphRewrites& all = graph_rewrites();
    absl::MutexLock lock(&all.mu);
    rewrites = all.rewrites;
  }
  for (GraphRewrite rewrite : rewrites) rewrite(graph);
}

absl::Status Callables::add_script(const std::string& source) {
  std::shared_ptr<torch::jit::CompilationUnit> unit;
  try {
    unit = torch::jit::compile(source);
    for (torch::jit::Function* fn : unit->get_functions()) {
      if (torch::jit::GraphFunction* graph_fn =
              torch::jit::tryToGraphFunction(*fn)) {
        graph_fn->ensure_defined();
        rewrite_graph(*graph_fn->graph());
      }
    }
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

absl::Status Callables::add_provider(
    std::string prefix, std::shared_ptr<CallableProvider> provider) {
  if (prefix.size() <= 2 || !absl::EndsWith(prefix, "::") ||
      provider == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a callable provider needs a prefix ending in '::', got '", prefix,
        "'"));
  }
  absl::MutexLock lock(&mu_);
  for (const auto& existing : providers_) {
    if (existing.first == prefix) {
      return absl::AlreadyExistsError(
          absl::StrCat("names under '", prefix, "' are already served"));
    }
  }
  providers_.emplace_back(std::move(prefix), std::move(provider));
  return absl::OkStatus();
}

std::shared_ptr<const std::vector<Callables::Overload>> Callables::overloads(
    const std::string& name) const {
  {
    absl::MutexLock lock(&mu_);
    auto cached = overloads_.find(name);
    if (cached != overloads_.end()) return cached->second;
  }
  auto found = std::make_shared<std::vector<Overload>>();
  c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& op : dispatcher.getAllOpNames()) {
    if (op.name != name) continue;
    c10::optional<c10::OperatorHandle> handle = dispatcher.findOp(op);
    if (handle.has_value() && handle->hasSchema()) {
      found->push_back(Overload{handle->schema(), *handle, nullptr});
    }
  }
  // TorchScript's own operators (prim::min, aten::len, ...) of the short
  // list of pure ones: the interpreter also has operators that write files
  // (aten::save) or need its own state. Only those with a fixed argument
  // list; the dispatcher's are listed there too.
  if (script_operator_allowed(name)) {
    for (const std::shared_ptr<torch::jit::Operator>& op :
         torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(name))) {
      if (op->isC10Op() || op->schema().is_vararg() ||
          op->schema().is_varret()) {
        continue;
      }
      found->push_back(Overload{op->schema(), std::nullopt, op});
    }
  }
  // Only a name that has overloads is cached: a library loaded later may
  // still register an unknown one.
  if (found->empty()) return found;
  absl::MutexLock lock(&mu_);
  return overloads_.emplace(name, std::move(found)).first->second;
}

absl::StatusOr<c10::IValue> Callables::call(absl::string_view name,
                                            std::vector<c10::IValue> args,
                                            const Kwargs& kwargs) const {
  std::shared_ptr<CallableProvider> provider;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [prefix, served] : providers_) {
      if (absl::StartsWith(name, prefix)) {
        provider = served;
        break;
      }
    }
  }
  if (provider != nullptr) {
    return provider->call(name, std::move(args), kwargs);
  }
  if (std::shared_ptr<const NativeFunction> native = function(name)) {
    return call_function(*native, name, std::move(args), kwargs);
  }
  if (std::optional<std::string> op = alias_of(name)) {
    return call(*op, std::move(args), kwargs);
  }
  size_t ns_end = name.find("::");
  if (ns_end != absl::string_view::npos) {
    c10::OperatorName op_name = split_operator_name(name);
    if (refused_operator(op_name)) return refusal(op_name);
    const bool full = name.find('.', ns_end) != absl::string_view::npos;
    if (full) {
      // A full name: that overload only (the dispatcher's first: fast).
      c10::optional<c10::OperatorHandle> op =
          c10::Dispatcher::singleton().findOp(op_name);
      const Overload* jit_only = nullptr;
      std::shared_ptr<const std::vector<Overload>> candidates;
      if (!op.has_value() || !op->hasSchema()) {
        candidates = overloads(op_name.name);
        for (const Overload& candidate : *candidates) {
          if (candidate.schema.overload_name() == op_name.overload_name) {
            jit_only = &candidate;
          }
        }
      }
      if ((op.has_value() && op->hasSchema()) || jit_only != nullptr) {
        const c10::FunctionSchema& schema =
            jit_only != nullptr ? jit_only->schema : op->schema();
        int cost = 0;
        absl::StatusOr<std::vector<c10::IValue>> stack =
            fit(schema, std::move(args), kwargs, cost);
        if (!stack.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("bad arguments for ", name, ": ",
                           stack.status().message(), "; its schema is ",
                           schema_text(schema)));
        }
        if (jit_only != nullptr) return jit_only->call(*std::move(stack));
        // Not through an Overload, which would copy the schema.
        return run_operator(&*op, nullptr, *std::move(stack));
      }
    } else if (auto candidates = overloads(std::string(name));
               !candidates->empty()) {
      // A bare name: the overload that fits the arguments best.
      const Overload* best = nullptr;
      std::vector<c10::IValue> best_stack;
      int best_cost = 0;
      std::vector<const Overload*> tied;
      for (const Overload& candidate : *candidates) {
        int cost = 0;
        absl::StatusOr<std::vector<c10::IValue>> stack =
            fit(candidate.schema, args, kwargs, cost, /*explain=*/false);
        if (!stack.ok()) continue;
        if (best == nullptr || cost < best_cost) {
          best = &candidate;
          best_cost = cost;
          best_stack = *std::move(stack);
          tied.clear();
        } else if (cost == best_cost) {
          tied.push_back(&candidate);
        }
      }
      if (best != nullptr && tied.empty()) {
        return best->call(std::move(best_stack));
      }
      std::vector<std::string> arg_types;
      for (const c10::IValue& arg : args) arg_types.push_back(type_name(arg));
      for (const auto& [key, value] : kwargs) {
        arg_types.push_back(absl::StrCat(key, "=", type_name(value)));
      }
      if (best == nullptr) {
        // Again, now saying why each one does not fit.
        std::vector<std::string> misfits;
        for (const Overload& candidate : *candidates) {
          int cost = 0;
          absl::StatusOr<std::vector<c10::IValue>> stack =
              fit(candidate.schema, args, kwargs, cost);
          misfits.push_back(absl::StrCat(schema_text(candidate.schema), " (",
                                         stack.status().message(), ")"));
        }
        // The peer's text first (sic: its tests match it), then which
        // overloads there are and why each one does not fit.
        return absl::InvalidArgumentError(absl::StrCat(
            "Overloaded torch operator invoked from Python failed to many any "
            "schema: no overload of ",
            name, " fits the arguments (",
            absl::StrJoin(arg_types, ", "), "); candidates: ",
            absl::StrJoin(misfits, "; ")));
      }
      // Several fit equally.
      {
        tied.insert(tied.begin(), best);
        std::vector<std::string> schemas;
        for (const Overload* candidate : tied) {
          schemas.push_back(schema_text(candidate->schema));
        }
        return absl::InvalidArgumentError(absl::StrCat(
            "the arguments (", absl::StrJoin(arg_types, ", "), ") of ", name,
            " fit several overloads equally; name one: ",
            absl::StrJoin(schemas, "; ")));
      }
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
        run_script_function(*init, std::move(args), kwargs);
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
        "no operator or TorchScript function named '", name,
        "' on this worker. A TORCH_LIBRARY operator in a Bazel cc_library is "
        "silently left out of the program unless that library has "
        "alwayslink = True (or the operator is registered with "
        "tether::register_function / Worker::register_function instead, "
        "which cannot be dropped)"));
  }
  return run_script_function(*fn, std::move(args), kwargs);
}

}  // namespace tether
