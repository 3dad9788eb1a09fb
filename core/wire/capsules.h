// The values the codec (core/wire/codec.h) carries that c10 has no IValue
// kind for, each held in an IValue capsule: a function or class named by
// reference (FunctionRef), a torch dtype, layout or memory format
// (TorchEnum) and a front end's object pickled (Pickled, and the
// ObjectEncoder that makes one). The front end makes and reads them
// (python/src/convert.cc); the codec moves them.
#ifndef TETHER_CORE_WIRE_CAPSULES_H_
#define TETHER_CORE_WIRE_CAPSULES_H_

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tether::wire {

// A function or class passed as a value, by name: in an IValue, a capsule
// (IValue::make_capsule) holding a FunctionRef. The codec moves the name
// (never empty); the receiver resolves it under its own policy (the Python
// front end: python/tether/rpc/_callee.py, docs/security.md).
struct FunctionRef : torch::CustomClassHolder {
  explicit FunctionRef(std::string name) : name(std::move(name)) {}
  const std::string name;

  static c10::IValue make(std::string name) {
    return c10::IValue::make_capsule(
        c10::make_intrusive<FunctionRef>(std::move(name)));
  }
  // The FunctionRef `v` holds, or nullptr.
  static const FunctionRef* of(const c10::IValue& v) {
    if (!v.isCapsule()) return nullptr;
    return dynamic_cast<const FunctionRef*>(v.toCapsule().get());
  }
};

// A torch.dtype, torch.layout or torch.memory_format passed as a value: in
// an IValue, a capsule holding a TorchEnum (c10 keeps these as plain ints,
// which would arrive as ints). `value` is the c10::ScalarType, c10::Layout
// or c10::MemoryFormat, as an int.
struct TorchEnum : torch::CustomClassHolder {
  enum class Kind { kDtype, kLayout, kMemoryFormat };
  TorchEnum(Kind kind, int64_t value) : kind(kind), value(value) {}
  const Kind kind;
  const int64_t value;

  static c10::IValue make(Kind kind, int64_t value) {
    return c10::IValue::make_capsule(
        c10::make_intrusive<TorchEnum>(kind, value));
  }
  // The TorchEnum `v` holds, or nullptr.
  static const TorchEnum* of(const c10::IValue& v) {
    if (!v.isCapsule()) return nullptr;
    return dynamic_cast<const TorchEnum*>(v.toCapsule().get());
  }
};

// An object that is not a wire value, pickled by a front end (Python:
// python/tether/rpc/_pickle.py): in an IValue, a capsule holding a Pickled.
// `data` is the pickle; `objects` are the values it refers to by index
// (persistent ids) instead of holding them: tensors, which travel out of
// band, and RRefs, which fork as any RRef does. The codec moves both and
// never looks inside `data`; the receiver unpickles it under its own policy
// (docs/security.md).
struct Pickled : torch::CustomClassHolder {
  Pickled(std::string data, std::vector<c10::IValue> objects)
      : data(std::move(data)), objects(std::move(objects)) {}
  const std::string data;
  const std::vector<c10::IValue> objects;

  static c10::IValue make(std::string data, std::vector<c10::IValue> objects) {
    return c10::IValue::make_capsule(
        c10::make_intrusive<Pickled>(std::move(data), std::move(objects)));
  }
  // The Pickled `v` holds, or nullptr.
  static const Pickled* of(const c10::IValue& v) {
    if (!v.isCapsule()) return nullptr;
    return dynamic_cast<const Pickled*>(v.toCapsule().get());
  }
};

// Turns a front end's object (IValue::isPyObject: the Python front end keeps
// a function's result so until it travels) into a Pickled value when encode
// meets one. Registered once by the front end (tether._C); without one, or
// when it fails, encode refuses the object with its Status. Called on the
// encoding thread; it must take whatever lock its language needs (the GIL).
using ObjectEncoder =
    absl::StatusOr<c10::IValue> (*)(const c10::IValue& object);
void set_object_encoder(ObjectEncoder encoder);

}  // namespace tether::wire

#endif  // TETHER_CORE_WIRE_CAPSULES_H_
