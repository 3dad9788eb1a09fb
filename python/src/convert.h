// Python objects <-> tether's wire values (c10::IValue), for the extension
// module tether._C.
//
// What travels is the codec's value set (core/wire/codec.h and
// capsules.h): tensors (as torch.Tensor, no copy), None, bool, int, float,
// complex, str, lists, tuples, dicts, torch.device, torch.dtype,
// torch.layout, torch.memory_format (wire::TorchEnum) and RRefs (a
// torch.Size is a tuple; sparse COO tensors stay sparse), and a caller's
// functions and classes by reference (the name tether.rpc gives them as `func`;
// the receiver resolves it under its policy, tether.rpc._callee.resolve_value).
// A caller's argument of any other type travels pickled (wire::Pickled, by
// tether.rpc._pickle, its tensors and RRefs lifted out), and is unpickled by
// the receiver under its own policy (docs/security.md). A callee's result of
// another type (an nn.Module made by remote()) is kept as an opaque Python
// object on its owner, and is pickled the same way (the codec's ObjectEncoder)
// only if it travels.
//
// Thread safety: every function needs the GIL.
#ifndef TETHER_PYTHON_SRC_CONVERT_H_
#define TETHER_PYTHON_SRC_CONVERT_H_

#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "core/callables.h"

namespace tether::python {

namespace py = pybind11;

enum class Objects {
  // Anything that is not a wire value is a TypeError (a caller's arguments).
  kRefuse,
  // Anything that is not a wire value becomes an opaque PyObject IValue (a
  // callee's result, which stays on its owner).
  kKeep,
};

// `where` names the value in errors ("argument 2 of 'py::__main__:f'").
// Throws py::type_error (kRefuse) or py::value_error (an int out of range).
c10::IValue to_ivalue(py::handle obj, Objects objects, const std::string& where);

// Tensors are the same tensors (shared storage); RRefs become tether RRef
// objects; an opaque object is the object itself; a pickled one is
// unpickled under this worker's policy (raises
// tether.rpc._callee.Failure naming what it refused).
py::object to_python(const c10::IValue& value);

// The arguments of a call of `fn` (its positional ones, its keyword ones),
// as to_ivalue with Objects::kRefuse; an argument that is a dtype, layout or
// memory format travels as the int c10 keeps it as, unless `fn` is a Python
// function ("py::..."). Errors name the argument and `fn`.
std::vector<c10::IValue> to_args(const py::tuple& args, const std::string& fn);
Kwargs to_kwargs(const py::dict& kwargs, const std::string& fn);

// Lets the codec send kept Python objects (pickled, as above). Called once
// when tether._C is imported.
void register_object_encoder();

}  // namespace tether::python

#endif  // TETHER_PYTHON_SRC_CONVERT_H_
