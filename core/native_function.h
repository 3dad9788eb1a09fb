// native_function(f): a plain C++ function or lambda as a NativeFunction
// (core/callables.h) that peers may call by name, with its arguments
// checked and converted from IValues as LibTorch's own operator
// registration converts them.
//
//   worker.register_function("my_add", [](at::Tensor a, at::Tensor b) {
//     return a + b;
//   });
//   // or, for every Worker of the process, before init_rpc:
//   absl::Status added = tether::register_function("my_add", my_add);
//
// Parameters may be any type a TORCH_LIBRARY operator takes (at::Tensor,
// const at::Tensor&, int64_t, double, bool, std::string, c10::Scalar,
// c10::optional<T>, std::vector<T>, c10::List<T>, c10::Dict, tuples,
// c10::IValue ...). The result may be such a type or void (None), a
// tether::Future<T> (the caller is answered when it completes, without a
// pool thread waiting: core/ivalue_future.h), an absl::Status or an
// absl::StatusOr<T> (an error reaches the caller with its code).
//
// A call whose arguments do not fit fails with INVALID_ARGUMENT naming the
// function, the argument's position, the expected and the given type:
//   "bad arguments for my_add: argument '_1' (position 1) must be Tensor,
//    got int; it takes (Tensor, Tensor)".
#ifndef TETHER_CORE_NATIVE_FUNCTION_H_
#define TETHER_CORE_NATIVE_FUNCTION_H_

#include <ATen/core/boxing/impl/make_boxed_from_unboxed_functor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <absl/status/statusor.h>
#include <c10/util/Metaprogramming.h>

#include <type_traits>
#include <utility>
#include <vector>

#include "core/callables.h"
#include "core/future.h"
#include "core/ivalue_future.h"

namespace tether {

// How a layer above core passes its own type T to and from native
// functions (rref/rref.h makes RRef one): specialize with
//   static T from(c10::IValue& v);   // throws StatusError if v is no T
//   static c10::IValue to(T value);
// Such a parameter appears as Any in the function's schema.
template <typename T>
struct NativeConverter;

namespace internal {

template <typename T, typename = void>
struct HasConverter : std::false_type {};
template <typename T>
struct HasConverter<T, std::void_t<decltype(NativeConverter<T>::from(
                           std::declval<c10::IValue&>()))>> : std::true_type {};

// The type a parameter has in the inferred schema.
template <typename A>
using SchemaType = std::conditional_t<HasConverter<std::decay_t<A>>::value,
                                      c10::IValue, std::decay_t<A>>;

template <typename T>
struct IsFuture : std::false_type {};
template <typename T>
struct IsFuture<Future<T>> : std::true_type {};
template <typename T>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<absl::StatusOr<T>> : std::true_type {};

template <typename T>
c10::IValue to_ivalue(T&& value) {
  using V = std::decay_t<T>;
  if constexpr (std::is_same_v<V, c10::IValue>) {
    return std::forward<T>(value);
  } else if constexpr (IsFuture<V>::value) {
    using U = typename V::ValueType;
    Future<U> future = std::forward<T>(value);
    return c10::IValue(to_ivalue_future(
        future.then([](const absl::StatusOr<U>& result)
                        -> absl::StatusOr<c10::IValue> {
          if (!result.ok()) return result.status();
          return to_ivalue(U(*result));
        })));
  } else if constexpr (HasConverter<V>::value) {
    return NativeConverter<V>::to(std::forward<T>(value));
  } else if constexpr (std::is_same_v<V, absl::Status>) {
    if (!value.ok()) throw StatusError(value);
    return c10::IValue();
  } else if constexpr (IsStatusOr<V>::value) {
    if (!value.ok()) throw StatusError(value.status());
    return to_ivalue(*std::forward<T>(value));
  } else {
    return c10::ivalue::from(std::forward<T>(value));
  }
}

template <typename A>
decltype(auto) from_ivalue(c10::IValue& value) {
  if constexpr (HasConverter<std::decay_t<A>>::value) {
    return NativeConverter<std::decay_t<A>>::from(value);
  } else {
    return c10::impl::ivalue_to_arg<
        typename c10::impl::decay_if_not_tensor<A>::type,
        /*AllowDeprecatedTypes=*/true>::call(value);
  }
}

template <typename F, typename... Args, size_t... I>
c10::IValue invoke(F& f, std::vector<c10::IValue>& stack,
                   c10::guts::typelist::typelist<Args...>* /*tag*/,
                   std::index_sequence<I...>) {
  using Ret = std::invoke_result_t<F&, Args...>;
  if constexpr (std::is_void_v<Ret>) {
    f(from_ivalue<Args>(stack[I])...);
    return c10::IValue();
  } else {
    return to_ivalue(f(from_ivalue<Args>(stack[I])...));
  }
}

template <typename... Args>
c10::FunctionSchema schema_of(c10::guts::typelist::typelist<Args...>* /*tag*/) {
  return c10::inferFunctionSchemaSingleReturn<c10::IValue(
      SchemaType<Args>...)>("", "");
}

}  // namespace internal

template <typename F>
NativeFunction native_function(F f) {
  using Traits = c10::guts::infer_function_traits_t<std::decay_t<F>>;
  using Params = typename Traits::parameter_types;
  constexpr size_t kArity = Traits::number_of_parameters;
  NativeFunction out;
  out.schema = internal::schema_of(static_cast<Params*>(nullptr));
  out.run = [f = std::move(f)](std::vector<c10::IValue> args,
                               const Kwargs&) mutable
      -> absl::StatusOr<c10::IValue> {
    try {
      return internal::invoke(f, args, static_cast<Params*>(nullptr),
                              std::make_index_sequence<kArity>());
    } catch (const StatusError& e) {
      return e.status();
    }
  };
  return out;
}

// Registers `f` (see native_function) for every Worker of this process.
template <typename F,
          typename = std::enable_if_t<
              !std::is_same_v<std::decay_t<F>, NativeFunction>>>
[[nodiscard]] absl::Status register_function(std::string name, F f) {
  return register_function(std::move(name), native_function(std::move(f)));
}

}  // namespace tether

#endif  // TETHER_CORE_NATIVE_FUNCTION_H_
