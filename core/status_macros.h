// Status helpers for code that calls tether, in the spirit of Abseil's
// internal ones (which Abseil 20220623 does not export):
//
//   absl::Status train_step(...) {
//     TETHER_ASSIGN_OR_RETURN(at::Tensor out,
//                             tether::rpc_sync<at::Tensor>("ps", "aten::add",
//                                                          {a, b}));
//     TETHER_RETURN_IF_ERROR(tether::shutdown());
//     ...
//   }
//
// Both evaluate their argument once and return its Status from the calling
// function when it is not OK; ASSIGN_OR_RETURN moves the value into `lhs`
// (a declaration or an lvalue) otherwise.
#ifndef TETHER_CORE_STATUS_MACROS_H_
#define TETHER_CORE_STATUS_MACROS_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <utility>

#define TETHER_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    const ::absl::Status tether_status_ = (expr);     \
    if (!tether_status_.ok()) return tether_status_;  \
  } while (false)

#define TETHER_INTERNAL_CONCAT_(a, b) a##b
#define TETHER_INTERNAL_CONCAT(a, b) TETHER_INTERNAL_CONCAT_(a, b)

#define TETHER_ASSIGN_OR_RETURN(lhs, expr)                                   \
  TETHER_INTERNAL_ASSIGN_OR_RETURN_(                                         \
      TETHER_INTERNAL_CONCAT(tether_statusor_, __LINE__), lhs, expr)

#define TETHER_INTERNAL_ASSIGN_OR_RETURN_(statusor, lhs, expr) \
  auto statusor = (expr);                                      \
  if (!statusor.ok()) return std::move(statusor).status();     \
  lhs = *std::move(statusor)

#endif  // TETHER_CORE_STATUS_MACROS_H_
