// The rules of the types values travel with: dict keys, and whether a
// value matches the type its container declares.
#include "core/wire/internal/codec_support.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <ATen/ops/_sparse_coo_tensor_unsafe.h>
#include <ATen/ops/_validate_sparse_coo_tensor_args.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>
#include <google/protobuf/arena.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/wire/wire.pb.h"

namespace tether::wire {
namespace codec_internal {
// ---------------------------------------------------------------------------
// Types

// Dict key types c10 can hash (c10::detail::DictKeyHash) and DictType::create
// accepts.
bool is_key_kind(c10::TypeKind kind) {
  switch (kind) {
    case c10::TypeKind::AnyType:
    case c10::TypeKind::IntType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::ComplexType:
    case c10::TypeKind::StringType:
    case c10::TypeKind::TensorType:
    case c10::TypeKind::DeviceObjType:
      return true;
    default:
      return false;
  }
}

bool is_hashable_key(const c10::IValue& v) {
  return v.isInt() || v.isString() || v.isDouble() || v.isComplexDouble() ||
         v.isBool() || v.isTensor() || v.isDevice();
}

// Whether a and b describe the same wire type: what the TypeDesc keeps
// (kinds and structure, not tensor shapes or NamedTuple names).
bool same_wire_type(const c10::Type& a, const c10::Type& b) {
  if (a.kind() != b.kind()) return false;
  auto a_contained = a.containedTypes();
  auto b_contained = b.containedTypes();
  if (a_contained.size() != b_contained.size()) return false;
  for (size_t i = 0; i < a_contained.size(); ++i) {
    if (!same_wire_type(*a_contained[i], *b_contained[i])) return false;
  }
  return true;
}

c10::TypePtr list_element_type(const c10::IValue& list) {
  return list.toList().elementType();
}

// Whether `v` may sit where a value of `type` is expected. Containers carry
// their own types; those must be the same wire type as the expected ones
// (c10 lists and dicts are invariant).
bool matches(const c10::IValue& v, const c10::Type& type) {
  switch (type.kind()) {
    case c10::TypeKind::AnyType:
      return true;
    case c10::TypeKind::NoneType:
      return v.isNone();
    case c10::TypeKind::BoolType:
      return v.isBool();
    case c10::TypeKind::IntType:
      return v.isInt();
    case c10::TypeKind::FloatType:
      return v.isDouble();
    case c10::TypeKind::ComplexType:
      return v.isComplexDouble();
    case c10::TypeKind::StringType:
      return v.isString();
    case c10::TypeKind::DeviceObjType:
      return v.isDevice();
    case c10::TypeKind::TensorType:
      return v.isTensor();
    case c10::TypeKind::RRefType:
      return v.isRRef();
    case c10::TypeKind::OptionalType:
      return v.isNone() ||
             matches(v, *type.expectRef<c10::OptionalType>().getElementType());
    case c10::TypeKind::ListType:
      return v.isList() &&
             same_wire_type(*list_element_type(v),
                            *type.expectRef<c10::ListType>().getElementType());
    case c10::TypeKind::DictType: {
      if (!v.isGenericDict()) return false;
      const auto& dict_type = type.expectRef<c10::DictType>();
      auto dict = v.toGenericDict();
      return same_wire_type(*dict.keyType(), *dict_type.getKeyType()) &&
             same_wire_type(*dict.valueType(), *dict_type.getValueType());
    }
    case c10::TypeKind::TupleType: {
      if (!v.isTuple()) return false;
      const auto& elems = v.toTupleRef().elements();
      auto types = type.expectRef<c10::TupleType>().elements();
      if (elems.size() != types.size()) return false;
      for (size_t i = 0; i < elems.size(); ++i) {
        if (!matches(elems[i], *types[i])) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

}  // namespace codec_internal

}  // namespace tether::wire
