#include "core/ivalue_future.h"

#include <c10/util/Exception.h>

#include <string>
#include <utility>

namespace tether {

StatusError::StatusError(absl::Status status)
    : std::runtime_error(std::string(status.message())),
      status_(std::move(status)) {}

absl::Status status_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(std::move(error));
  } catch (const StatusError& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return absl::UnknownError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::UnknownError(e.what());
  } catch (...) {
    return absl::UnknownError("a non-standard exception");
  }
}

c10::intrusive_ptr<c10::ivalue::Future> to_ivalue_future(
    Future<c10::IValue> future) {
  auto out = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  future.on_complete([out](const absl::StatusOr<c10::IValue>& result) {
    if (result.ok()) {
      out->markCompleted(*result);
    } else {
      out->setError(std::make_exception_ptr(StatusError(result.status())));
    }
  });
  return out;
}

Future<c10::IValue> from_ivalue_future(
    c10::intrusive_ptr<c10::ivalue::Future> future) {
  Promise<c10::IValue> promise;
  future->addCallback([promise](c10::ivalue::Future& done) {
    if (done.hasError()) {
      promise.set(status_of(done.exception_ptr()));
    } else {
      promise.set(done.constValue());
    }
  });
  return promise.future();
}

Future<c10::IValue> settle(absl::StatusOr<c10::IValue> result) {
  if (result.ok() && result->isFuture()) {
    return from_ivalue_future(result->toFuture());
  }
  return Future<c10::IValue>::ready(std::move(result));
}

}  // namespace tether
