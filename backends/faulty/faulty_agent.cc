#include "backends/faulty/faulty_agent.h"

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/random/random.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/strings/string_view.h>
#include <absl/strings/strip.h>
#include <absl/synchronization/mutex.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/common/refusals.h"
#include "backends/common/settings_toolkit.h"
#include "core/toolkit/check.h"
#include "core/toolkit/timer.h"

namespace tether::backends {
namespace {

constexpr char kBackendName[] = "faulty";
constexpr char kInnerKey[] = "faulty.inner";
constexpr char kFailKey[] = "faulty.fail";
constexpr char kDropBoundKey[] = "faulty.drop_bound_ms";

// injected_faults(): this process's totals.
std::atomic<int64_t> g_failed{0};
std::atomic<int64_t> g_dropped{0};
std::atomic<int64_t> g_delayed{0};

constexpr absl::Duration kDefaultDropBound = absl::Seconds(10);
// Message types are small wire numbers; names are looked up below this.
constexpr int32_t kMaxTypeValue = 256;

struct Faults {
  std::string inner;
  // Sends of a type still to fail or drop.
  absl::flat_hash_map<MessageType, int64_t> fail;
  absl::flat_hash_map<MessageType, int64_t> drop;
  absl::flat_hash_map<MessageType, absl::Duration> delay;
  absl::Duration jitter = absl::ZeroDuration();
  absl::Duration drop_bound = kDefaultDropBound;
};

absl::Status bad_setting(absl::string_view key, absl::string_view value,
                         absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("setting ", key, ": '", value, "' ", why));
}

std::vector<std::string> type_names() {
  std::vector<std::string> names;
  for (int32_t v = 0; v < kMaxTypeValue; ++v) {
    absl::string_view name = message_type_name(static_cast<MessageType>(v));
    if (name != "INVALID") names.emplace_back(name);
  }
  return names;
}

std::optional<MessageType> type_named(absl::string_view name) {
  for (int32_t v = 0; v < kMaxTypeValue; ++v) {
    const auto type = static_cast<MessageType>(v);
    absl::string_view known = message_type_name(type);
    if (known != "INVALID" && known == name) return type;
  }
  return std::nullopt;
}

// Parses "TYPE:N[,TYPE:N...]" with N >= 0.
absl::StatusOr<absl::flat_hash_map<MessageType, int64_t>> parse_type_counts(
    absl::string_view key, absl::string_view value, absl::string_view unit) {
  absl::flat_hash_map<MessageType, int64_t> out;
  for (absl::string_view entry : absl::StrSplit(value, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    if (parts.size() != 2) {
      return bad_setting(key, value,
                         absl::StrCat("is not a comma list of TYPE:", unit));
    }
    absl::string_view name = absl::StripAsciiWhitespace(parts[0]);
    std::optional<MessageType> type = type_named(name);
    if (!type.has_value()) {
      return bad_setting(
          key, value,
          absl::StrCat("names an unknown message type '", name,
                       "'; known types: ", absl::StrJoin(type_names(), ", ")));
    }
    int64_t count = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[1]), &count) ||
        count < 0) {
      return bad_setting(key, value,
                         absl::StrCat("has '", parts[1], "' for ", name,
                                      ", not a non-negative integer ", unit));
    }
    if (!out.emplace(*type, count).second) {
      return bad_setting(key, value,
                         absl::StrCat("names ", name, " more than once"));
    }
  }
  return out;
}

// The counts of "TYPE:N,..." into `field` (fail, drop).
auto counts_into(absl::flat_hash_map<MessageType, int64_t> Faults::*field) {
  return [field](absl::string_view key, const std::string& value,
                 Faults& faults) -> absl::Status {
    absl::StatusOr<absl::flat_hash_map<MessageType, int64_t>> counts =
        parse_type_counts(key, value, "N");
    if (!counts.ok()) return counts.status();
    faults.*field = *std::move(counts);
    return absl::OkStatus();
  };
}

const common::SettingsTable<Faults>& settings_table() {
  static const auto* const kTable = new common::SettingsTable<Faults>(
      kBackendName,
      {
          {kInnerKey,
           [](absl::string_view key, const std::string& value,
              Faults& faults) -> absl::Status {
             if (value.empty()) return bad_setting(key, value, "is empty");
             if (value == kBackendName) {
               return bad_setting(key, value,
                                  "cannot wrap the faulty backend itself");
             }
             faults.inner = value;
             return absl::OkStatus();
           }},
          {kFailKey, counts_into(&Faults::fail)},
          {"faulty.drop", counts_into(&Faults::drop)},
          {kDropBoundKey, common::ms_into(&Faults::drop_bound, 1)},
          {"faulty.delay",
           [](absl::string_view key, const std::string& value,
              Faults& faults) -> absl::Status {
             absl::StatusOr<absl::flat_hash_map<MessageType, int64_t>> millis =
                 parse_type_counts(key, value, "MILLIS");
             if (!millis.ok()) return millis.status();
             for (const auto& [type, ms] : *millis) {
               faults.delay[type] = absl::Milliseconds(ms);
             }
             return absl::OkStatus();
           }},
          {"faulty.jitter_ms", common::ms_into(&Faults::jitter, 1)},
      });
  return *kTable;
}

absl::StatusOr<Faults> parse_faults(
    const absl::flat_hash_map<std::string, std::string>& settings) {
  Faults faults;
  if (absl::Status read = settings_table().read(settings, faults); !read.ok()) {
    return read;
  }
  // The table refuses an empty faulty.inner: empty is not given.
  if (faults.inner.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the faulty backend needs setting ", kInnerKey,
                     " (the name of the backend it wraps)"));
  }
  return faults;
}

class FaultyAgent final : public Agent {
 public:
  FaultyAgent(std::unique_ptr<Agent> inner, Faults faults)
      : inner_(std::move(inner)),
        fail_(std::move(faults.fail)),
        drop_(std::move(faults.drop)),
        delay_(std::move(faults.delay)),
        jitter_(faults.jitter),
        drop_bound_(faults.drop_bound),
        timers_(this) {}

  ~FaultyAgent() override { shutdown(); }

  absl::Status start(RequestHandler handler) override {
    return inner_->start(std::move(handler));
  }

  Future<Message> send(const WorkerInfo& to, Message request,
                       absl::Duration timeout) override {
    const MessageType type = request.type;
    enum class Fault { kNone, kFail, kDrop, kDelay } fault = Fault::kNone;
    absl::Duration delay = absl::ZeroDuration();
    {
      absl::MutexLock lock(&mu_);
      if (closed_) {
        return common::refused(
            common::sent_after_shutdown(inner_->self().name, type, to.name));
      }
      if (take_one(fail_, type)) {
        fault = Fault::kFail;
      } else if (take_one(drop_, type)) {
        fault = Fault::kDrop;
      } else {
        if (auto it = delay_.find(type); it != delay_.end()) delay = it->second;
        if (jitter_ > absl::ZeroDuration()) {
          delay += absl::Microseconds(absl::Uniform<int64_t>(
              random_, 0, absl::ToInt64Microseconds(jitter_) + 1));
        }
        if (delay > absl::ZeroDuration()) fault = Fault::kDelay;
      }
    }
    switch (fault) {
      case Fault::kNone:
        return inner_->send(to, std::move(request), timeout);
      case Fault::kFail:
        g_failed.fetch_add(1, std::memory_order_relaxed);
        return common::refused(absl::UnavailableError(
            absl::StrCat(message_type_name(type), " to '", to.name,
                         "' failed by the faulty agent (", kFailKey, ")")));
      case Fault::kDrop:
        g_dropped.fetch_add(1, std::memory_order_relaxed);
        return drop(to, type, timeout);
      case Fault::kDelay:
        g_delayed.fetch_add(1, std::memory_order_relaxed);
        return hold_then_send(to, std::move(request), timeout, delay);
    }
    TETHER_CHECK(false, "unknown fault");
    return {};
  }

  const WorkerInfo& self() const override { return inner_->self(); }

  const std::vector<WorkerInfo>& worker_infos() const override {
    return inner_->worker_infos();
  }

  absl::Status add_peer(const WorkerInfo& worker) override {
    return inner_->add_peer(worker);
  }
  void remove_peer(const WorkerInfo& worker) override {
    inner_->remove_peer(worker);
  }

  absl::Status join(absl::Duration timeout,
                    const std::function<void()>& all_joined = {}) override {
    const absl::Time deadline = absl::Now() + timeout;
    {
      absl::MutexLock lock(&mu_);
      auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return held_.empty();
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&drained), deadline)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "join timed out after ", absl::FormatDuration(timeout), ": ",
            held_.size(), " requests still held (dropped or delayed) by the ",
            "faulty agent of '", inner_->self().name, "'"));
      }
    }
    return inner_->join(std::max(deadline - absl::Now(), absl::ZeroDuration()),
                        all_joined);
  }

  void shutdown() override {
    absl::flat_hash_map<int64_t, Held> held;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      held.swap(held_);
    }
    for (auto& [id, entry] : held) {
      timers_.cancel(entry.timer);
      entry.promise.set(
          common::shut_down_with_request_pending(inner_->self().name));
    }
    inner_->shutdown();
  }

 private:
  // A send this agent keeps: dropped (its timer fails it) or delayed (its
  // timer sends it on).
  struct Held {
    Promise<Message> promise;
    internal::TimerQueue::Id timer = 0;
    std::optional<Message> message;  // delayed sends only
    WorkerInfo to;
    MessageType type = MessageType::kUnknown;
    absl::Duration timeout;  // the sender's
    absl::Time deadline;     // the sender's, for a delayed send
    std::string why;         // for the error of a send that never left
  };

  static bool take_one(absl::flat_hash_map<MessageType, int64_t>& counts,
                       MessageType type) {
    auto it = counts.find(type);
    if (it == counts.end() || it->second == 0) return false;
    --it->second;
    return true;
  }

  // Registers a held send that `fire` ends at `when`. The timer is set
  // under the lock so that shutdown() finds it with its timer.
  Future<Message> hold(Held entry, absl::Time when,
                       void (FaultyAgent::*fire)(int64_t id)) {
    Future<Message> future = entry.promise.future();
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        const int64_t id = next_id_++;
        // Runs on the timer thread; `this` outlives it (timers_ is
        // destroyed first, joining that thread).
        entry.timer =
            timers_.schedule(when, [this, id, fire] { (this->*fire)(id); });
        held_.emplace(id, std::move(entry));
        return future;
      }
    }
    // Not inside send() (core/agent.h).
    return common::refused(common::sent_after_shutdown(
        inner_->self().name, entry.type, entry.to.name));
  }

  std::optional<Held> take(int64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return std::nullopt;  // shut down meanwhile
    Held entry = std::move(it->second);
    held_.erase(it);
    return entry;
  }

  Future<Message> drop(const WorkerInfo& to, MessageType type,
                       absl::Duration timeout) {
    Held entry;
    entry.to = to;
    entry.type = type;
    entry.timeout = timeout;
    entry.why = "dropped by the faulty agent";
    const absl::Duration wait =
        timeout == absl::InfiniteDuration() ? drop_bound_ : timeout;
    return hold(std::move(entry), absl::Now() + wait, &FaultyAgent::expire);
  }

  // The timer of a send that never left: the sender's timeout, or the drop
  // bound.
  void expire(int64_t id) {
    std::optional<Held> entry = take(id);
    if (!entry.has_value()) return;
    if (entry->timeout == absl::InfiniteDuration()) {
      entry->promise.set(absl::DeadlineExceededError(absl::StrCat(
          "request to '", entry->to.name, "' was ", entry->why,
          " and, sent without a timeout, failed after ",
          absl::FormatDuration(drop_bound_), " (", kDropBoundKey, ")")));
      return;
    }
    entry->promise.set(absl::DeadlineExceededError(absl::StrCat(
        "request to '", entry->to.name, "' timed out after ",
        absl::FormatDuration(entry->timeout), " (", entry->why, ")")));
  }

  Future<Message> hold_then_send(const WorkerInfo& to, Message request,
                                 absl::Duration timeout, absl::Duration delay) {
    Held entry;
    entry.to = to;
    entry.type = request.type;
    entry.timeout = timeout;
    entry.deadline = absl::Now() + timeout;
    entry.message = std::move(request);
    const bool outlasts = timeout != absl::InfiniteDuration() && delay >= timeout;
    Promise<Message> promise = entry.promise;
    Future<Message> future =
        hold(std::move(entry), absl::Now() + delay, &FaultyAgent::send_late);
    if (outlasts) {
      // The sender gives up before the message leaves; it leaves all the
      // same (a timeout ends the caller's wait, not the delivery: core's
      // PendingRequests::set_connection), and its answer is dropped.
      timers_.schedule(absl::Now() + timeout, [promise, to, timeout, delay] {
        promise.set(absl::DeadlineExceededError(absl::StrCat(
            "request to '", to.name, "' timed out after ",
            absl::FormatDuration(timeout), " (delayed by the faulty agent by ",
            absl::FormatDuration(delay), ")")));
      });
    }
    return future;
  }

  // A delayed send's timer. It stays held until the inner agent has it, so
  // that join() does not see a gap.
  void send_late(int64_t id) {
    Message message;
    WorkerInfo to;
    absl::Time deadline;
    Promise<Message> promise;
    {
      absl::MutexLock lock(&mu_);
      auto it = held_.find(id);
      if (it == held_.end()) return;  // shut down meanwhile
      message = std::move(*it->second.message);
      to = it->second.to;
      deadline = it->second.deadline;
      promise = it->second.promise;
    }
    // What is left of the sender's timeout (the timer may have run late). A
    // send whose sender gave up already still goes (its answer is dropped),
    // bounded by the drop bound so that nothing waits forever.
    const absl::Duration left =
        deadline == absl::InfiniteFuture() ? absl::InfiniteDuration()
        : deadline > absl::Now()           ? deadline - absl::Now()
                                           : drop_bound_;
    inner_->send(to, std::move(message), left)
        .on_complete([promise](const absl::StatusOr<Message>& response) {
          promise.set(response);
        });
    absl::MutexLock lock(&mu_);
    held_.erase(id);
  }

  const std::unique_ptr<Agent> inner_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<MessageType, int64_t> fail_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<MessageType, int64_t> drop_ ABSL_GUARDED_BY(mu_);
  const absl::flat_hash_map<MessageType, absl::Duration> delay_;
  const absl::Duration jitter_;
  absl::BitGen random_ ABSL_GUARDED_BY(mu_);
  const absl::Duration drop_bound_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<int64_t, Held> held_ ABSL_GUARDED_BY(mu_);
  // Last: destroyed first, so no timer runs on a half-destroyed agent.
  internal::TimerQueue timers_;
};

}  // namespace

Backend faulty_backend(const BackendRegistry* inner_backends) {
  Backend backend;
  backend.name = kBackendName;
  // Whether the wrapped backend can run is known only from the settings,
  // at creation.
  backend.viable = [] { return absl::OkStatus(); };
  backend.create =
      [inner_backends](
          AgentSetup setup) -> absl::StatusOr<std::unique_ptr<Agent>> {
    absl::StatusOr<Faults> faults = parse_faults(setup.settings);
    if (!faults.ok()) return faults.status();
    absl::StatusOr<const Backend*> inner = inner_backends->find(faults->inner);
    if (!inner.ok()) {
      return absl::Status(
          inner.status().code(),
          absl::StrCat("setting ", kInnerKey, ": ", inner.status().message()));
    }
    if (absl::Status viable = (*inner)->viable(); !viable.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("backend '", faults->inner, "' (", kInnerKey,
                       ") cannot run here: ", viable.message()));
    }
    absl::StatusOr<std::unique_ptr<Agent>> agent =
        (*inner)->create(std::move(setup));
    if (!agent.ok()) return agent.status();
    return std::make_unique<FaultyAgent>(*std::move(agent), *std::move(faults));
  };
  return backend;
}

InjectedFaults injected_faults() {
  InjectedFaults faults;
  faults.failed = g_failed.load(std::memory_order_relaxed);
  faults.dropped = g_dropped.load(std::memory_order_relaxed);
  faults.delayed = g_delayed.load(std::memory_order_relaxed);
  return faults;
}

}  // namespace tether::backends
