// The wire's numbering of dtypes, layouts and memory formats (stable:
// tether's own, not c10's), both ways.
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
// dtypes

bool to_wire_dtype(c10::ScalarType type, pb::DType* out) {
  switch (type) {
    case c10::ScalarType::Byte:
      *out = pb::DTYPE_UINT8;
      return true;
    case c10::ScalarType::Char:
      *out = pb::DTYPE_INT8;
      return true;
    case c10::ScalarType::Short:
      *out = pb::DTYPE_INT16;
      return true;
    case c10::ScalarType::Int:
      *out = pb::DTYPE_INT32;
      return true;
    case c10::ScalarType::Long:
      *out = pb::DTYPE_INT64;
      return true;
    case c10::ScalarType::Half:
      *out = pb::DTYPE_FLOAT16;
      return true;
    case c10::ScalarType::Float:
      *out = pb::DTYPE_FLOAT32;
      return true;
    case c10::ScalarType::Double:
      *out = pb::DTYPE_FLOAT64;
      return true;
    case c10::ScalarType::ComplexHalf:
      *out = pb::DTYPE_COMPLEX32;
      return true;
    case c10::ScalarType::ComplexFloat:
      *out = pb::DTYPE_COMPLEX64;
      return true;
    case c10::ScalarType::ComplexDouble:
      *out = pb::DTYPE_COMPLEX128;
      return true;
    case c10::ScalarType::Bool:
      *out = pb::DTYPE_BOOL;
      return true;
    case c10::ScalarType::BFloat16:
      *out = pb::DTYPE_BFLOAT16;
      return true;
    default:
      return false;
  }
}

// `wire` is an int, not the enum: proto3 enums are open.
bool from_wire_dtype(int wire, c10::ScalarType* out) {
  switch (wire) {
    case pb::DTYPE_UINT8:
      *out = c10::ScalarType::Byte;
      return true;
    case pb::DTYPE_INT8:
      *out = c10::ScalarType::Char;
      return true;
    case pb::DTYPE_INT16:
      *out = c10::ScalarType::Short;
      return true;
    case pb::DTYPE_INT32:
      *out = c10::ScalarType::Int;
      return true;
    case pb::DTYPE_INT64:
      *out = c10::ScalarType::Long;
      return true;
    case pb::DTYPE_FLOAT16:
      *out = c10::ScalarType::Half;
      return true;
    case pb::DTYPE_FLOAT32:
      *out = c10::ScalarType::Float;
      return true;
    case pb::DTYPE_FLOAT64:
      *out = c10::ScalarType::Double;
      return true;
    case pb::DTYPE_COMPLEX32:
      *out = c10::ScalarType::ComplexHalf;
      return true;
    case pb::DTYPE_COMPLEX64:
      *out = c10::ScalarType::ComplexFloat;
      return true;
    case pb::DTYPE_COMPLEX128:
      *out = c10::ScalarType::ComplexDouble;
      return true;
    case pb::DTYPE_BOOL:
      *out = c10::ScalarType::Bool;
      return true;
    case pb::DTYPE_BFLOAT16:
      *out = c10::ScalarType::BFloat16;
      return true;
    default:
      return false;
  }
}

// Layouts and memory formats, c10's and the wire's.
constexpr std::pair<c10::Layout, pb::Layout> kLayouts[] = {
    {c10::Layout::Strided, pb::LAYOUT_STRIDED},
    {c10::Layout::Sparse, pb::LAYOUT_SPARSE_COO},
    {c10::Layout::SparseCsr, pb::LAYOUT_SPARSE_CSR},
    {c10::Layout::SparseCsc, pb::LAYOUT_SPARSE_CSC},
    {c10::Layout::SparseBsr, pb::LAYOUT_SPARSE_BSR},
    {c10::Layout::SparseBsc, pb::LAYOUT_SPARSE_BSC},
    {c10::Layout::Mkldnn, pb::LAYOUT_MKLDNN},
};
constexpr std::pair<c10::MemoryFormat, pb::MemoryFormat> kMemoryFormats[] = {
    {c10::MemoryFormat::Contiguous, pb::MEMORY_FORMAT_CONTIGUOUS},
    {c10::MemoryFormat::Preserve, pb::MEMORY_FORMAT_PRESERVE},
    {c10::MemoryFormat::ChannelsLast, pb::MEMORY_FORMAT_CHANNELS_LAST},
    {c10::MemoryFormat::ChannelsLast3d, pb::MEMORY_FORMAT_CHANNELS_LAST_3D},
};

// The wire number of c10 enum value `value` in `table`, 0 if none.
template <typename C10, typename Wire, size_t N>
int wire_of(const std::pair<C10, Wire> (&table)[N], int64_t value) {
  for (const auto& [c10_value, wire] : table) {
    if (static_cast<int64_t>(c10_value) == value) return wire;
  }
  return 0;
}

// The c10 enum value (as an int) of wire number `wire` in `table`, -1 if
// none.
template <typename C10, typename Wire, size_t N>
int64_t c10_of(const std::pair<C10, Wire> (&table)[N], int wire) {
  for (const auto& [c10_value, w] : table) {
    if (w == wire) return static_cast<int64_t>(c10_value);
  }
  return -1;
}

// The wire number of `e`'s value, 0 if it has none.
int to_wire_enum(const TorchEnum& e) {
  switch (e.kind) {
    case TorchEnum::Kind::kDtype: {
      pb::DType dtype;
      const bool known =
          e.value >= 0 &&
          e.value < static_cast<int64_t>(c10::ScalarType::NumOptions) &&
          to_wire_dtype(static_cast<c10::ScalarType>(e.value), &dtype);
      return known ? dtype : 0;
    }
    case TorchEnum::Kind::kLayout:
      return wire_of(kLayouts, e.value);
    case TorchEnum::Kind::kMemoryFormat:
      return wire_of(kMemoryFormats, e.value);
  }
  return 0;
}

// The TorchEnum of a wire kind and number, or a null IValue if unknown.
c10::IValue from_wire_enum(int kind, int wire) {
  using Kind = TorchEnum::Kind;
  switch (kind) {
    case pb::EnumValue::KIND_DTYPE: {
      c10::ScalarType dtype;
      if (!from_wire_dtype(wire, &dtype)) return c10::IValue();
      return TorchEnum::make(Kind::kDtype, static_cast<int64_t>(dtype));
    }
    case pb::EnumValue::KIND_LAYOUT: {
      const int64_t layout = c10_of(kLayouts, wire);
      if (layout < 0) return c10::IValue();
      return TorchEnum::make(Kind::kLayout, layout);
    }
    case pb::EnumValue::KIND_MEMORY_FORMAT: {
      const int64_t format = c10_of(kMemoryFormats, wire);
      if (format < 0) return c10::IValue();
      return TorchEnum::make(Kind::kMemoryFormat, format);
    }
    default:
      return c10::IValue();
  }
}

}  // namespace codec_internal

}  // namespace tether::wire
