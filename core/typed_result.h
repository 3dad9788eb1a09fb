// value_as<T>: a call's result (a c10::IValue) as the C++ type the caller
// expects, with a Status instead of LibTorch's internal assert when it is
// something else.
//
//   absl::StatusOr<at::Tensor> sum = tether::rpc_sync<at::Tensor>(
//       "w1", "aten::add.Tensor", {a, b});
//   // a result of another type: INVALID_ARGUMENT "the result of
//   // 'aten::add.Tensor' is a Tensor, not int"
//
// T is any type c10::IValue converts to (at::Tensor, int64_t, double, bool,
// std::string, std::vector<at::Tensor>, std::vector<int64_t>,
// c10::intrusive_ptr<...>, std::tuple<...>, ...); c10::IValue itself
// passes through.
#ifndef TETHER_CORE_TYPED_RESULT_H_
#define TETHER_CORE_TYPED_RESULT_H_

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <c10/util/Exception.h>

#include <string>
#include <type_traits>
#include <utility>

namespace tether {

// `what` names the value in the error ("the result of 'aten::add.Tensor'").
template <typename T>
[[nodiscard]] absl::StatusOr<T> value_as(c10::IValue value,
                                         absl::string_view what) {
  if constexpr (std::is_same_v<T, c10::IValue>) {
    return value;
  } else {
    std::string expected;
    try {
      expected = c10::getTypePtr<T>()->str();
    } catch (const c10::Error&) {
      expected = "the requested type";
    }
    const std::string actual = value.isNone() ? std::string("None")
                                               : value.type()->str();
    // Conversions LibTorch checks with an assert: check first.
    bool fits = true;
    if constexpr (std::is_same_v<T, at::Tensor>) {
      fits = value.isTensor();
    } else if constexpr (std::is_same_v<T, int64_t>) {
      fits = value.isInt();
    } else if constexpr (std::is_same_v<T, double>) {
      fits = value.isDouble() || value.isInt();
    } else if constexpr (std::is_same_v<T, bool>) {
      fits = value.isBool();
    } else if constexpr (std::is_same_v<T, std::string>) {
      fits = value.isString();
    }
    if (fits) {
      try {
        if constexpr (std::is_same_v<T, double>) {
          if (value.isInt()) return static_cast<double>(value.toInt());
        }
        return std::move(value).to<T>();
      } catch (const c10::Error&) {
        // Falls through to the error below (a list of the wrong element
        // type, a tuple of another arity, ...).
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is a ", actual, ", not ", expected));
  }
}

}  // namespace tether

#endif  // TETHER_CORE_TYPED_RESULT_H_
