#include "python/src/convert.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/python/python_ivalue.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <vector>

#include "core/wire/capsules.h"
#include "core/wire/codec.h"
#include "rref/rref.h"

namespace tether::python {
namespace {

std::string describe_type(py::handle obj) {
  py::handle type = py::type::handle_of(obj);
  std::string module = py::str(type.attr("__module__"));
  std::string name = py::str(type.attr("__qualname__"));
  return module == "builtins" ? name : module + "." + name;
}

// tether.rpc._pickle, imported once (under the GIL; leaked: the module
// lives as long as the interpreter).
py::handle pickle_module() {
  static PyObject* module = nullptr;
  if (module == nullptr) {
    py::object imported = py::module_::import("tether.rpc._pickle");
    if (module == nullptr) module = imported.release().ptr();
  }
  return module;
}

// `obj` pickled (tether.rpc._pickle.dumps), its tensors and RRefs lifted
// out as wire values. Throws py::type_error naming `where` if it cannot be.
c10::IValue pickled(py::handle obj, const std::string& where) {
  py::tuple dumped;
  try {
    dumped = pickle_module().attr("dumps")(obj);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    throw py::type_error(where + " is a " + describe_type(obj) + " and " +
                         std::string(py::str(e.value())) +
                         " (docs/python.md, what travels by value)");
  }
  py::list lifted = dumped[1];
  std::vector<c10::IValue> objects;
  objects.reserve(lifted.size());
  for (size_t i = 0; i < lifted.size(); ++i) {
    objects.push_back(to_ivalue(lifted[i], Objects::kRefuse, where));
  }
  return wire::Pickled::make(dumped[0].cast<std::string>(),
                             std::move(objects));
}

// The codec's ObjectEncoder: a kept Python object (a function's result)
// leaving in a message.
absl::StatusOr<c10::IValue> encode_object(const c10::IValue& object) {
  py::gil_scoped_acquire gil;
  try {
    return pickled(object.toPyObject(), "a Python object");
  } catch (py::error_already_set& e) {
    return absl::InvalidArgumentError(e.what());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

// The element type a homogeneous list of these kinds keeps on the wire.
enum class Kind { kNone, kTensor, kBool, kInt, kFloat, kStr, kOther };

Kind kind_of(py::handle obj) {
  PyObject* p = obj.ptr();
  if (THPVariable_Check(p)) return Kind::kTensor;
  if (PyBool_Check(p)) return Kind::kBool;
  if (PyLong_Check(p)) return Kind::kInt;
  if (PyFloat_CheckExact(p)) return Kind::kFloat;
  if (PyUnicode_Check(p)) return Kind::kStr;
  return Kind::kOther;
}

c10::TypePtr type_of(Kind kind) {
  switch (kind) {
    case Kind::kTensor:
      return c10::TensorType::get();
    case Kind::kBool:
      return c10::BoolType::get();
    case Kind::kInt:
      return c10::IntType::get();
    case Kind::kFloat:
      return c10::FloatType::get();
    case Kind::kStr:
      return c10::StringType::get();
    default:
      return c10::AnyType::get();
  }
}

// The common kind of `items`, or kOther.
template <typename Items>
Kind common_kind(const Items& items) {
  Kind common = Kind::kNone;
  for (py::handle item : items) {
    Kind k = kind_of(item);
    if (common == Kind::kNone) {
      common = k;
    } else if (k != common) {
      return Kind::kOther;
    }
  }
  return common;
}

// A function or class argument: its reference (tether.rpc decides the
// name, as for `func`), or a null IValue for any other object.
c10::IValue function_reference(py::handle obj, const std::string& where) {
  py::object name;
  try {
    name = py::module_::import("tether.rpc").attr("_reference_value")(obj);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    throw py::type_error(where + ": " + std::string(py::str(e.value())));
  }
  if (name.is_none()) return c10::IValue();
  return wire::FunctionRef::make(name.cast<std::string>());
}

// Containers being converted on this thread: a value nested deeper than
// any the wire carries (a cyclic list, a deep tuple a peer pickled) is
// refused before it can overflow the stack.
thread_local int nesting = 0;

struct Nested {
  explicit Nested(const std::string& where) {
    if (++nesting > wire::kMaxSupportedDepth) {
      --nesting;
      throw py::value_error(where + " nests containers deeper than " +
                            std::to_string(wire::kMaxSupportedDepth));
    }
  }
  ~Nested() { --nesting; }
};

}  // namespace

c10::IValue to_ivalue(py::handle obj, Objects objects,
                      const std::string& where) {
  PyObject* p = obj.ptr();
  if (THPVariable_Check(p)) return THPVariable_Unpack(p);
  if (p == Py_None) return c10::IValue();
  if (PyBool_Check(p)) return c10::IValue(p == Py_True);
  if (PyLong_Check(p)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
    if (overflow != 0) {
      throw py::value_error(where + " is an int out of the 64-bit range");
    }
    return c10::IValue(static_cast<int64_t>(v));
  }
  // Exactly a float: numpy.float64 (a float subclass) is pickled, so that
  // it arrives as itself.
  if (PyFloat_CheckExact(p)) return c10::IValue(PyFloat_AS_DOUBLE(p));
  if (PyUnicode_Check(p)) return c10::IValue(obj.cast<std::string>());
  if (PyComplex_Check(p)) {
    return c10::IValue(c10::complex<double>(PyComplex_RealAsDouble(p),
                                            PyComplex_ImagAsDouble(p)));
  }
  if (py::isinstance<RRef>(obj)) return obj.cast<const RRef&>().to_ivalue();
  if (THPDevice_Check(p)) {
    return c10::IValue(reinterpret_cast<THPDevice*>(p)->device);
  }
  using EnumKind = wire::TorchEnum::Kind;
  if (THPDtype_Check(p)) {
    return wire::TorchEnum::make(
        EnumKind::kDtype,
        static_cast<int64_t>(reinterpret_cast<THPDtype*>(p)->scalar_type));
  }
  if (THPLayout_Check(p)) {
    return wire::TorchEnum::make(
        EnumKind::kLayout,
        static_cast<int64_t>(reinterpret_cast<THPLayout*>(p)->layout));
  }
  if (THPMemoryFormat_Check(p)) {
    return wire::TorchEnum::make(
        EnumKind::kMemoryFormat,
        static_cast<int64_t>(
            reinterpret_cast<THPMemoryFormat*>(p)->memory_format));
  }
  // A tuple subclass (a namedtuple) would arrive as a plain tuple: its
  // class cannot travel. torch.Size is the one that may, as a tuple.
  if (PyTuple_CheckExact(p) || THPSize_Check(p)) {
    Nested nested(where);
    py::tuple tuple = py::reinterpret_borrow<py::tuple>(obj);
    std::vector<c10::IValue> elements;
    elements.reserve(tuple.size());
    for (size_t i = 0; i < tuple.size(); ++i) {
      elements.push_back(to_ivalue(tuple[i], objects,
                                   where + "[" + std::to_string(i) + "]"));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  // Exactly lists and dicts: a subclass (OrderedDict, Counter) is pickled,
  // so that it arrives as itself.
  if (PyList_CheckExact(p)) {
    Nested nested(where);
    py::list list = py::reinterpret_borrow<py::list>(obj);
    Kind kind = common_kind(list);
    c10::impl::GenericList out(kind == Kind::kNone ? c10::AnyType::get()
                                                   : type_of(kind));
    out.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      out.push_back(
          to_ivalue(list[i], objects, where + "[" + std::to_string(i) + "]"));
    }
    return out;
  }
  if (PyDict_CheckExact(p)) {
    Nested nested(where);
    py::dict dict = py::reinterpret_borrow<py::dict>(obj);
    std::vector<py::handle> keys;
    std::vector<py::handle> values;
    for (auto item : dict) {
      keys.push_back(item.first);
      values.push_back(item.second);
    }
    Kind key_kind = common_kind(keys);
    if (key_kind == Kind::kNone) key_kind = Kind::kStr;
    if (key_kind != Kind::kStr && key_kind != Kind::kInt &&
        key_kind != Kind::kTensor) {
      throw py::type_error(
          where + " is a dict whose keys are not all str, all int or all "
                  "tensors: tether sends only such dicts");
    }
    Kind value_kind = common_kind(values);
    c10::impl::GenericDict out(type_of(key_kind),
                               value_kind == Kind::kNone
                                   ? c10::AnyType::get()
                                   : type_of(value_kind));
    for (size_t i = 0; i < keys.size(); ++i) {
      std::string key_where = where + "[" + std::string(py::repr(keys[i])) + "]";
      out.insert(to_ivalue(keys[i], Objects::kRefuse, key_where),
                 to_ivalue(values[i], objects, key_where));
    }
    return out;
  }
  if (objects == Objects::kKeep) {
    return c10::IValue(c10::ivalue::ConcretePyObjectHolder::create(
        py::reinterpret_borrow<py::object>(obj)));
  }
  // Functions and classes travel by reference; any other object pickled.
  c10::IValue reference = function_reference(obj, where);
  if (!reference.isNone()) return reference;
  return pickled(obj, where);
}

void register_object_encoder() { wire::set_object_encoder(&encode_object); }

py::object to_python(const c10::IValue& value) {
  if (value.isTensor()) {
    return py::reinterpret_steal<py::object>(
        THPVariable_Wrap(value.toTensor()));
  }
  if (value.isNone()) return py::none();
  if (value.isBool()) return py::bool_(value.toBool());
  if (value.isInt()) return py::int_(value.toInt());
  if (value.isDouble()) return py::float_(value.toDouble());
  if (value.isString()) return py::str(value.toStringRef());
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    py::tuple out(elements.size());
    for (size_t i = 0; i < elements.size(); ++i) {
      out[i] = to_python(elements[i]);
    }
    return out;
  }
  if (value.isList()) {
    c10::ArrayRef<c10::IValue> elements = value.toListRef();
    py::list out(elements.size());
    for (size_t i = 0; i < elements.size(); ++i) {
      out[i] = to_python(elements[i]);
    }
    return out;
  }
  if (value.isGenericDict()) {
    py::dict out;
    for (const auto& entry : value.toGenericDict()) {
      out[to_python(entry.key())] = to_python(entry.value());
    }
    return out;
  }
  if (value.isRRef()) {
    absl::StatusOr<RRef> rref = RRef::from_ivalue(value);
    if (!rref.ok()) throw std::runtime_error(rref.status().ToString());
    return py::cast(*std::move(rref));
  }
  if (value.isPyObject()) {
    return py::reinterpret_borrow<py::object>(value.toPyObject());
  }
  if (const wire::Pickled* p = wire::Pickled::of(value)) {
    // Under this worker's policy (raises tether.rpc._callee.Failure naming
    // what it refused).
    py::list objects(p->objects.size());
    for (size_t i = 0; i < p->objects.size(); ++i) {
      objects[i] = to_python(p->objects[i]);
    }
    return pickle_module().attr("loads")(
        py::memoryview::from_memory(p->data.data(),
                                    static_cast<ssize_t>(p->data.size())),
        objects);
  }
  if (const wire::FunctionRef* ref = wire::FunctionRef::of(value)) {
    // Under this worker's policy, as a called function (raises
    // tether.rpc._callee.Failure naming it if refused).
    return py::module_::import("tether.rpc._callee")
        .attr("resolve_value")(ref->name);
  }
  if (const wire::TorchEnum* e = wire::TorchEnum::of(value)) {
    switch (e->kind) {
      case wire::TorchEnum::Kind::kDtype:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
            torch::getTHPDtype(static_cast<at::ScalarType>(e->value))));
      case wire::TorchEnum::Kind::kLayout:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
            torch::getTHPLayout(static_cast<at::Layout>(e->value))));
      case wire::TorchEnum::Kind::kMemoryFormat:
        return py::reinterpret_borrow<py::object>(
            torch::utils::getTHPMemoryFormat(
                static_cast<c10::MemoryFormat>(e->value)));
    }
  }
  // Complex numbers, devices, custom-class objects: LibTorch's own
  // conversion.
  return torch::jit::toPyObject(value);
}

namespace {

// An argument of `fn`. LibTorch operators take dtypes, layouts and memory
// formats as the ints c10 keeps them as (`ScalarType? dtype`), so an
// operator's arguments carry them so; a Python function's keep them as
// themselves (wire::TorchEnum).
c10::IValue to_arg(py::handle obj, const std::string& fn,
                   const std::string& where) {
  c10::IValue v = to_ivalue(obj, Objects::kRefuse, where);
  const bool python_function = fn.rfind("py::", 0) == 0;
  if (const wire::TorchEnum* e = wire::TorchEnum::of(v);
      e != nullptr && !python_function) {
    return c10::IValue(e->value);
  }
  return v;
}

}  // namespace

std::vector<c10::IValue> to_args(const py::tuple& args,
                                 const std::string& fn) {
  std::vector<c10::IValue> out;
  out.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    out.push_back(to_arg(args[i], fn,
                         "argument " + std::to_string(i + 1) + " of '" + fn +
                             "'"));
  }
  return out;
}

Kwargs to_kwargs(const py::dict& kwargs, const std::string& fn) {
  Kwargs out;
  for (auto item : kwargs) {
    std::string key = py::str(item.first);
    out.emplace(key, to_arg(item.second, fn,
                            "keyword argument '" + key + "' of '" + fn + "'"));
  }
  return out;
}

}  // namespace tether::python
