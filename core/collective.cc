// Worker::all_gather and Worker::barrier over a subset of the group.
//
// The set's first name (in sorted order) leads: each other member calls
// the leader's "tether_collective.gather" with its value; that function
// answers later (core/ivalue_future.h), once every member has given its
// value, with all of them, so no thread waits on the leader meanwhile. The
// calls of one set are told apart by a sequence number each member counts
// alike. While a member waits it probes the workers it waits for (the
// leader probes those that have not arrived, the others probe the leader):
// a lost one ends the wait, naming it. A second, empty round follows, so
// that the leader returns only once every member has its answer (as the
// peer's leader returns only once it has sent the result to everyone).
#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>

#include "core/ivalue_future.h"
#include "core/worker.h"

namespace tether {
namespace internal {

constexpr char kGather[] = "tether_collective.gather";
constexpr absl::Duration kProbeInterval = absl::Seconds(1);

class CollectiveState {
 public:
  // The id of this worker's next call over the set `key`.
  std::string next_id(const std::string& key) {
    absl::MutexLock lock(&mu_);
    return absl::StrCat(key, "#", sequence_[key]++);
  }

  // `from`'s value for call `id` of `expected` members: the future of
  // every member's value, by name.
  Future<c10::IValue> contribute(const std::string& id, const std::string& from,
                                 c10::IValue value, int64_t expected) {
    std::shared_ptr<Call> call;
    {
      absl::MutexLock lock(&mu_);
      auto failed = failed_.find(id);
      if (failed != failed_.end()) {
        return Future<c10::IValue>::ready(failed->second);
      }
      std::shared_ptr<Call>& slot = calls_[id];
      if (slot == nullptr) slot = std::make_shared<Call>();
      call = slot;
      call->values[from] = std::move(value);
      if (static_cast<int64_t>(call->values.size()) < expected) {
        return call->done.future();
      }
      calls_.erase(id);
    }
    c10::impl::GenericDict all(c10::StringType::get(), c10::AnyType::get());
    for (auto& [name, v] : call->values) all.insert(name, v);
    call->done.set(c10::IValue(std::move(all)));
    return call->done.future();
  }

  // The names of `members` that have not given a value to call `id`.
  std::vector<std::string> missing(const std::string& id,
                                   const std::vector<std::string>& members) {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    std::vector<std::string> out;
    for (const std::string& name : members) {
      if (it == calls_.end() || !it->second->values.contains(name)) {
        out.push_back(name);
      }
    }
    return out;
  }

  // Ends call `id` with `status`, for those waiting and those to come.
  void fail(const std::string& id, const absl::Status& status) {
    std::shared_ptr<Call> call;
    {
      absl::MutexLock lock(&mu_);
      failed_.emplace(id, status);
      auto it = calls_.find(id);
      if (it == calls_.end()) return;
      call = it->second;
      calls_.erase(it);
    }
    call->done.set(status);
  }

 private:
  struct Call {
    absl::flat_hash_map<std::string, c10::IValue> values;
    Promise<c10::IValue> done;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> sequence_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> calls_
      ABSL_GUARDED_BY(mu_);
  // Failed calls (few: a failure usually ends the group's work).
  absl::flat_hash_map<std::string, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

absl::Status Worker::start_collectives() {
  collectives_ = std::make_shared<internal::CollectiveState>();
  std::weak_ptr<internal::CollectiveState> weak = collectives_;
  NativeFunction gather;
  gather.run = [weak](std::vector<c10::IValue> args,
                      const Kwargs&) -> absl::StatusOr<c10::IValue> {
    if (args.size() != 4 || !args[0].isString() || !args[1].isString() ||
        !args[3].isInt()) {
      return absl::InvalidArgumentError(
          "malformed all_gather contribution: expected (id, name, value, "
          "members)");
    }
    std::shared_ptr<internal::CollectiveState> state = weak.lock();
    if (state == nullptr) return absl::CancelledError("the worker is gone");
    return c10::IValue(to_ivalue_future(
        state->contribute(args[0].toStringRef(), args[1].toStringRef(),
                          std::move(args[2]), args[3].toInt())));
  };
  return callables_.add_function(internal::kGather, std::move(gather));
}

absl::Status Worker::probe(const WorkerInfo& who) {
  Message ping;
  ping.type = MessageType::kPing;
  absl::StatusOr<Message> pong =
      send(who, std::move(ping), options_.peer_timeout).get();
  if (pong.ok() || pong.status().code() == absl::StatusCode::kCancelled) {
    return pong.status();
  }
  return absl::UnavailableError(absl::StrCat(
      "worker ", describe(who), " is lost: it did not answer a "
      "liveness probe within ", absl::FormatDuration(options_.peer_timeout),
      " (", pong.status().message(), ")"));
}

absl::StatusOr<std::map<std::string, c10::IValue>> Worker::all_gather(
    c10::IValue value, std::vector<std::string> names,
    absl::Duration timeout) {
  const WorkerInfo& self = agent_->self();
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kStopped) {
      return absl::CancelledError(absl::StrCat(
          "worker '", self.name, "' is shut down; cannot all_gather"));
    }
  }
  if (names.empty()) {
    for (const WorkerInfo& info : get_all_worker_infos()) {
      names.push_back(info.name);
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::vector<WorkerInfo> members;
  for (const std::string& name : names) {
    absl::StatusOr<WorkerInfo> info = get_worker_info(To(name));
    if (!info.ok()) return info.status();
    members.push_back(*info);
  }
  if (!std::binary_search(names.begin(), names.end(), self.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", self.name, "' cannot all_gather over a set without it (",
        absl::StrJoin(names, ", "), ")"));
  }
  const absl::Time deadline = timeout <= absl::ZeroDuration() ||
                                      timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + timeout;
  const std::string id = collectives_->next_id(absl::StrJoin(names, ","));
  const WorkerInfo& leader = members.front();
  const bool leading = leader.name == self.name;
  const int64_t expected = static_cast<int64_t>(names.size());
  // One round: every member's value for `round`, by name, once all gave it.
  auto gather = [&](const std::string& round,
                    c10::IValue mine) -> absl::StatusOr<c10::IValue> {
    Future<c10::IValue> gathered =
        leading ? collectives_->contribute(round, self.name, std::move(mine),
                                           expected)
                : rpc_async(To(leader), internal::kGather,
                            {c10::IValue(round), c10::IValue(self.name),
                             std::move(mine), c10::IValue(expected)},
                            {},
                            deadline == absl::InfiniteFuture()
                                ? absl::InfiniteDuration()
                                : deadline - absl::Now());
    while (!gathered.wait(std::min(deadline, absl::Now() + internal::kProbeInterval))
                .ok()) {
      absl::Status lost = absl::OkStatus();
      if (absl::Now() >= deadline) {
        std::vector<std::string> missing =
            leading ? collectives_->missing(round, names)
                    : std::vector<std::string>{leader.name};
        lost = absl::DeadlineExceededError(absl::StrCat(
            "all_gather over (", absl::StrJoin(names, ", "), ") on worker '",
            self.name, "' timed out after ", absl::FormatDuration(timeout),
            " waiting for ", absl::StrJoin(missing, ", ")));
      } else if (leading) {
        for (const std::string& name : collectives_->missing(round, names)) {
          lost = probe(members[std::lower_bound(names.begin(), names.end(),
                                                name) -
                               names.begin()]);
          if (!lost.ok()) break;
        }
      } else {
        lost = probe(leader);
      }
      if (!lost.ok()) {
        if (leading) collectives_->fail(round, lost);
        return lost;
      }
    }
    return gathered.result();
  };
  absl::StatusOr<c10::IValue> result = gather(id, std::move(value));
  if (!result.ok()) return result.status();
  // A second round, for the leader's sake: it returns only once every
  // member has its answer, so a leader that exits right after the call
  // cannot take the others' answers with it. A member that has its answer
  // needs nothing more of the leader (which may be gone by then).
  absl::StatusOr<c10::IValue> delivered =
      gather(absl::StrCat(id, "/delivered"), c10::IValue());
  if (leading && !delivered.ok()) return delivered.status();
  if (!result->isGenericDict()) {
    return absl::InternalError("all_gather's leader answered with no dict");
  }
  std::map<std::string, c10::IValue> out;
  for (const auto& entry : result->toGenericDict()) {
    out.emplace(entry.key().toStringRef(), entry.value());
  }
  return out;
}

absl::Status Worker::barrier(std::vector<std::string> names,
                             absl::Duration timeout) {
  return all_gather(c10::IValue(), std::move(names), timeout).status();
}

}  // namespace tether
