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

std::string describe_peer(absl::string_view peer_name, int rank) {
  if (peer_name.empty()) return absl::StrCat("the worker of rank ", rank);
  return absl::StrCat("worker '", peer_name, "' (rank ", rank, ")");
}

absl::Status peer_lost(absl::string_view peer_name, int rank,
                       absl::string_view why) {
  return absl::UnavailableError(
      absl::StrCat(describe_peer(peer_name, rank), " is lost: ", why));
}

absl::Status peer_left(absl::string_view self_name, absl::string_view peer_name,
                       int rank) {
  return absl::UnavailableError(
      absl::StrCat(describe_peer(peer_name, rank),
                   " has left the group of worker '", self_name, "'"));
}

absl::Status peer_shut_down(absl::string_view self_name,
                            absl::string_view peer_name, int rank) {
  return absl::UnavailableError(
      absl::StrCat(describe_peer(peer_name, rank), " has shut down (worker '",
                   self_name, "' was told)"));
}

absl::Status connection_lost(absl::string_view self_name,
                             absl::string_view peer_name, int rank,
                             absl::string_view why, absl::StatusCode code) {
  return absl::Status(
      code, absl::StrCat("lost the connection between worker '", self_name,
                         "' and ", describe_peer(peer_name, rank), ": ", why));
}

}  // namespace tether::backends::common
