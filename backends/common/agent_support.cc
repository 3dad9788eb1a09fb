#include "backends/common/agent_support.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tether::backends::common {

bool ShutdownOnce::begin(bool on_own_thread) {
  std::shared_ptr<absl::Notification> joined;
  {
    absl::MutexLock lock(&mu_);
    if (!begun_) {
      begun_ = true;
      return true;
    }
    if (on_own_thread) return false;
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    mu_.Await(absl::Condition(&done));
    joined = joined_;
  }
  joined->WaitForNotification();
  return false;
}

void ShutdownOnce::finish(bool on_own_thread, std::function<void()> joins) {
  auto joined = std::make_shared<absl::Notification>();
  if (on_own_thread) {
    std::thread([joins = std::move(joins), joined]() mutable {
      joins();
      joins = nullptr;  // what it owned goes on this thread too
      joined->Notify();
    }).detach();
  } else {
    joins();
    joined->Notify();
  }
  absl::MutexLock lock(&mu_);
  joined_ = std::move(joined);
  done_ = true;
}

absl::StatusOr<std::vector<std::string>> exchange_through_store(
    c10d::Store& store, absl::string_view key_prefix, int rank,
    int world_size, const std::string& mine, absl::Duration timeout,
    absl::string_view who) {
  std::vector<std::string> keys;
  for (int peer = 0; peer < world_size; ++peer) {
    keys.push_back(absl::StrCat(key_prefix, peer));
  }
  try {
    store.set(keys[rank], std::vector<uint8_t>(mine.begin(), mine.end()));
    try {
      store.wait(keys, std::chrono::milliseconds(std::max<int64_t>(
                           1, absl::ToInt64Milliseconds(timeout))));
    } catch (const std::exception&) {
      std::vector<std::string> missing;
      for (int peer = 0; peer < world_size; ++peer) {
        if (!store.check({keys[peer]})) missing.push_back(absl::StrCat(peer));
      }
      if (!missing.empty()) {
        return absl::DeadlineExceededError(absl::StrCat(
            who, " timed out after ", absl::FormatDuration(timeout),
            " waiting for the address of rank(s) ",
            absl::StrJoin(missing, ", ")));
      }
    }
    std::vector<std::string> published;
    for (const std::string& key : keys) {
      std::vector<uint8_t> bytes = store.get(key);
      published.emplace_back(bytes.begin(), bytes.end());
    }
    return published;
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(who, ": the rendezvous store failed: ", e.what()));
  }
}

absl::Status join_group(join::StoreJoin& joiner,
                        internal::PendingRequests& pending, absl::Mutex& mu,
                        const bool& closed, const int64_t& incoming,
                        absl::string_view worker, absl::Duration timeout) {
  auto is_closed = [&mu, &closed] {
    absl::MutexLock lock(&mu);
    return closed;
  };
  if (is_closed()) {
    return absl::CancelledError(
        absl::StrCat("worker '", worker, "' has shut down"));
  }
  join::DrainHooks hooks;
  // shutdown() empties `pending`.
  hooks.wait_outgoing_drained = [&pending](absl::Time deadline) {
    return pending.wait_until_empty(deadline);
  };
  hooks.active_count = [&pending, &mu, &incoming] {
    // Both counts of one instant: `incoming` holds still under `mu`.
    absl::MutexLock lock(&mu);
    return static_cast<int64_t>(pending.size()) + incoming;
  };
  absl::Status joined = joiner.join(hooks, timeout);
  if (joined.ok() && is_closed()) {
    return absl::CancelledError(
        absl::StrCat("worker '", worker, "' shut down while joining"));
  }
  return joined;
}

absl::Status install_handler(RequestHandler handler, bool closed,
                             absl::string_view worker,
                             std::shared_ptr<const RequestHandler>& slot) {
  if (closed) {
    return absl::CancelledError(
        absl::StrCat("worker '", worker, "' has shut down"));
  }
  if (slot != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("start() called twice on worker '", worker, "'"));
  }
  slot = std::make_shared<const RequestHandler>(std::move(handler));
  return absl::OkStatus();
}

absl::Status sent_after_shutdown(absl::string_view worker, MessageType type,
                                 absl::string_view to) {
  return absl::CancelledError(
      absl::StrCat("worker '", worker, "' has shut down; cannot send ",
                   message_type_name(type), " to '", to, "'"));
}

Future<Message> call_handler(const RequestHandler& handler, Message request,
                             absl::string_view worker) {
  Future<Message> response;
  try {
    response = handler(std::move(request));
  } catch (const std::exception& e) {
    return Future<Message>::ready(absl::InternalError(absl::StrCat(
        "the request handler of worker '", worker, "' threw: ", e.what())));
  }
  if (!response.valid()) {
    return Future<Message>::ready(absl::InternalError(
        absl::StrCat("the request handler of worker '", worker,
                     "' returned an invalid future")));
  }
  return response;
}

}  // namespace tether::backends::common
