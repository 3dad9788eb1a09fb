#include "backends/common/refusals.h"

#include <absl/strings/str_cat.h>

#include <utility>

#include "core/toolkit/check.h"
#include "core/toolkit/serial_executor.h"

namespace tether::backends::common {
namespace {

tether::internal::SerialExecutor& refusal_thread() {
  // Never destroyed: agents refuse until the process exits, and a static
  // destructor would join a thread another static may still post to.
  static auto* const executor = new tether::internal::SerialExecutor();
  return *executor;
}

}  // namespace

Future<Message> refused(absl::Status status) {
  TETHER_CHECK(!status.ok(), "refused() with an OK status");
  Promise<Message> promise;
  Future<Message> future = promise.future();
  on_refusal_thread([promise, status = std::move(status)]() mutable {
    promise.set(std::move(status));
  });
  return future;
}

void on_refusal_thread(std::function<void()> task) {
  const bool posted = refusal_thread().post(std::move(task));
  TETHER_CHECK(posted, "the refusal thread never stops");
}

absl::Status sent_after_shutdown(absl::string_view self_name, MessageType type,
                                 absl::string_view to) {
  return absl::CancelledError(
      absl::StrCat("worker '", self_name, "' has shut down; cannot send ",
                   message_type_name(type), " to '", to, "'"));
}

absl::Status not_in_group(absl::string_view self_name, absl::string_view to) {
  return absl::UnavailableError(absl::StrCat(
      "worker '", to, "' is not in the group of worker '", self_name, "'"));
}

absl::Status shut_down_with_request_pending(absl::string_view self_name) {
  return absl::CancelledError(absl::StrCat(
      "worker '", self_name, "' shut down with the request pending"));
}

}  // namespace tether::backends::common
