#include "backends/common/agent_support.h"

#include <absl/strings/match.h>
#include <absl/strings/str_join.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "core/toolkit/store_wait.h"

namespace tether::backends::common {

absl::StatusOr<std::vector<std::string>> exchange_addresses(
    c10d::Store& store, absl::string_view key_prefix, int rank, int world_size,
    absl::string_view mine, absl::Duration timeout, absl::string_view who) {
  std::vector<std::string> keys;
  for (int i = 0; i < world_size; ++i) {
    keys.push_back(absl::StrCat(key_prefix, i));
  }
  try {
    store.set(keys[rank], std::vector<uint8_t>(mine.begin(), mine.end()));
    // Woken by each address's arrival (core/toolkit/store_wait.h).
    if (!tether::internal::wait_for_keys(store, keys, absl::Now() + timeout)) {
      std::vector<std::string> missing;
      for (int i = 0; i < world_size; ++i) {
        if (!store.check({keys[i]})) missing.push_back(absl::StrCat(i));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          who, " timed out after ", absl::FormatDuration(timeout),
          " waiting for the address of rank(s) ",
          absl::StrJoin(missing, ", ")));
    }
    std::vector<std::string> addresses;
    for (const std::string& key : keys) {
      std::vector<uint8_t> bytes = store.get(key);
      addresses.emplace_back(bytes.begin(), bytes.end());
    }
    return addresses;
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(who, ": the rendezvous store failed: ", e.what()));
  }
}

absl::Status join_agent(join::StoreJoin& joiner,
                        tether::internal::PendingRequests& pending,
                        const std::function<int64_t()>& unanswered,
                        const std::function<bool()>& closed,
                        absl::string_view self_name, absl::Duration timeout,
                        const Liveness& liveness,
                        const std::function<void()>& all_joined) {
  if (closed()) {
    return absl::CancelledError(
        absl::StrCat("worker '", self_name, "' has shut down"));
  }
  join::DrainHooks hooks;
  // shutdown() empties `pending`.
  // PINGs left out: they make no work, and one to a lost peer may wait the
  // peer timeout.
  hooks.wait_outgoing_drained = [&pending](absl::Time deadline) {
    return pending.wait_until_no_calls(deadline);
  };
  hooks.active_count = [&pending, &unanswered] {
    // Outgoing first: a request to this very agent stays pending until
    // after it is answered, so it is never missed between the two reads.
    const auto outgoing = static_cast<int64_t>(pending.calls());
    return outgoing + unanswered();
  };
  if (liveness.send) {
    hooks.check_alive = [&liveness](const std::vector<int>& ranks) {
      return check_alive(liveness, ranks);
    };
  }
  hooks.all_arrived = all_joined;
  // Nothing in a join is in a hurry: the waits for its PINGs' answers and
  // those of its hooks sleep rather than poll, so a worker waiting in
  // shutdown() spends no core on them (core/future.h, SleepingWaits).
  tether::internal::SleepingWaits sleeping;
  absl::Status joined = joiner.join(hooks, timeout);
  if (closed() && joined.ok()) {
    return absl::CancelledError(
        absl::StrCat("worker '", self_name, "' shut down while joining"));
  }
  return joined;
}

absl::Status check_alive(const Liveness& liveness,
                         const std::vector<int>& ranks) {
  std::vector<Future<Message>> answers;
  for (int rank : ranks) {
    Message ping;
    ping.type = MessageType::kPing;
    answers.push_back(liveness.send((*liveness.workers)[rank], std::move(ping),
                                    liveness.peer_timeout));
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    absl::StatusOr<Message> answer = answers[i].get();
    if (answer.ok()) continue;  // any answer, even a refusal, means alive
    const WorkerInfo& who = (*liveness.workers)[ranks[i]];
    if (answer.status().code() == absl::StatusCode::kCancelled) {
      return answer.status();
    }
    const bool silent =
        answer.status().code() == absl::StatusCode::kDeadlineExceeded;
    // The transport may have named the loss already (libfabric does).
    if (!silent &&
        absl::StartsWith(answer.status().message(),
                         absl::StrCat(describe_peer(who.name, who.id),
                                      " is lost"))) {
      return absl::UnavailableError(answer.status().message());
    }
    return peer_lost(
        who.name, who.id,
        silent ? absl::StrCat("it left a liveness probe unanswered for ",
                              absl::FormatDuration(liveness.peer_timeout),
                              " (the peer timeout)")
               : std::string(answer.status().message()));
  }
  return absl::OkStatus();
}

Future<Message> call_handler(const RequestHandler& handler, Message request,
                             absl::string_view self_name) {
  Future<Message> response;
  try {
    response = handler(std::move(request));
  } catch (const std::exception& e) {
    return Future<Message>::ready(absl::InternalError(absl::StrCat(
        "the request handler of worker '", self_name, "' threw: ", e.what())));
  }
  if (!response.valid()) {
    return Future<Message>::ready(absl::InternalError(
        absl::StrCat("the request handler of worker '", self_name,
                     "' returned an invalid future")));
  }
  return response;
}

const void*& handler_mark() {
  thread_local const void* mark = nullptr;
  return mark;
}

bool ShutdownSequence::begin(bool own_thread) {
  std::shared_ptr<absl::Notification> finisher;
  {
    absl::MutexLock lock(&mu_);
    if (!begun_) {
      begun_ = true;
      return true;
    }
    if (own_thread) return false;
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    mu_.Await(absl::Condition(&done));
    finisher = finisher_;
  }
  if (finisher != nullptr) finisher->WaitForNotification();
  return false;
}

void ShutdownSequence::finish(bool own_thread, std::function<void()> joins) {
  std::shared_ptr<absl::Notification> finisher;
  if (own_thread) {
    finisher = std::make_shared<absl::Notification>();
    std::thread([joins = std::move(joins), finisher]() mutable {
      joins();
      joins = nullptr;
      finisher->Notify();
    }).detach();
  } else {
    joins();
  }
  absl::MutexLock lock(&mu_);
  finisher_ = std::move(finisher);
  done_ = true;
}

}  // namespace tether::backends::common
