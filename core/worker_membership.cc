// Worker: joining and leaving a dynamic group (core/join/membership.h has
// the protocol's store side; Worker::shutdown the user's view).
//
// A joiner holds the membership token while it tells every member of
// itself (MEMBER_JOIN: the member's agent adds it as a peer); a leaver
// holds it while it tells every member it leaves (MEMBER_LEAVE: the member
// stops new calls to it, answers once its calls to it in flight are done,
// then its agent drops the peer). A member that cannot be told is lost and
// is dropped from the group, so a dead worker never holds a join or a
// leave up for longer than the peer timeout.
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>
#include <c10/core/thread_pool.h>
#include <glog/logging.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/join/membership.h"
#include "core/worker.h"

namespace tether {
namespace {

Message member_message(MessageType type, const WorkerInfo& who) {
  Message message;
  message.type = type;
  message.payload = join::format_members({who});
  return message;
}

bool lost(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

// How often a worker waiting for members' answers asks the silent ones
// whether they are alive.
constexpr absl::Duration kProbeInterval = absl::Seconds(1);

}  // namespace

absl::Status Worker::count_send_to(const WorkerInfo& to) {
  absl::MutexLock lock(&members_mu_);
  auto it = std::lower_bound(
      members_.begin(), members_.end(), to.id,
      [](const WorkerInfo& info, int rank) { return info.id < rank; });
  if (it == members_.end() || !(*it == to)) {
    auto gone = left_.find(to.name);
    const WorkerInfo& self = agent_->self();
    if (gone != left_.end()) {
      return absl::UnavailableError(absl::StrCat(
          named_worker(to), " has left the group of worker '", self.name, "'"));
    }
    return absl::NotFoundError(absl::StrCat(
        named_worker(to), " is not a member of the group of worker '",
        self.name, "'"));
  }
  ++in_flight_to_[to.id];
  ++in_flight_;
  return absl::OkStatus();
}

void Worker::sent_to_done(int rank) {
  std::vector<std::function<void()>> ready;
  {
    absl::MutexLock lock(&members_mu_);
    --in_flight_;
    auto it = in_flight_to_.find(rank);
    if (it == in_flight_to_.end() || --it->second > 0) return;
    in_flight_to_.erase(it);
    for (auto w = drained_waiters_.begin(); w != drained_waiters_.end();) {
      if (w->first == rank) {
        ready.push_back(std::move(w->second));
        w = drained_waiters_.erase(w);
      } else {
        ++w;
      }
    }
  }
  for (std::function<void()>& done : ready) done();
}

absl::Status Worker::tell_members(MessageType type,
                                  const std::vector<WorkerInfo>& to,
                                  std::vector<WorkerInfo>& gone) {
  const WorkerInfo self = agent_->self();
  // The agent's own answers (send_counted): an EXCEPTION is a member that is
  // alive and refuses, a failed send one the transport lost.
  std::vector<Future<Message>> answers;
  for (const WorkerInfo& member : to) {
    answers.push_back(send_counted(member, member_message(type, self),
                                   absl::InfiniteDuration()));
  }
  auto drop = [&](const WorkerInfo& member, absl::string_view why) {
    LOG(WARNING) << "worker '" << self.name << "' drops "
                 << named_worker(member)
                 << " from the group, lost while it was told of a "
                 << message_type_name(type) << ": " << why;
    gone.push_back(member);
  };
  absl::Status first_error = absl::OkStatus();
  for (size_t i = 0; i < to.size(); ++i) {
    // A member answers a leave once its calls to this worker are done,
    // which may take as long as they do; meanwhile it must stay alive.
    absl::Status silent;
    while (!answers[i].is_ready()) {
      if (answers[i].wait(absl::Now() + kProbeInterval).ok()) break;
      Message ping;
      ping.type = MessageType::kPing;
      absl::StatusOr<Message> pong =
          send_counted(to[i], std::move(ping), options_.peer_timeout).get();
      if (!pong.ok() && lost(pong.status())) {
        silent = pong.status();
        break;
      }
    }
    if (!answers[i].is_ready()) {
      drop(to[i], absl::StrCat("it answered no liveness probe: ",
                               silent.message()));
      continue;
    }
    absl::StatusOr<Message> answer = answers[i].get();
    absl::Status refused;
    if (!answer.ok()) {
      if (lost(answer.status())) {
        // Lost, or only the connection the answer was to come on? A member
        // is dropped from the group only if it does not answer a probe
        // either.
        Message ping;
        ping.type = MessageType::kPing;
        absl::StatusOr<Message> pong =
            send_counted(to[i], std::move(ping), options_.peer_timeout).get();
        if (!pong.ok() && lost(pong.status())) {
          drop(to[i], answer.status().message());
          continue;
        }
        LOG(WARNING) << "worker '" << self.name << "': the answer of worker '"
                     << to[i].name << "' to its " << message_type_name(type)
                     << " was lost (" << answer.status().message()
                     << "), but the worker is alive";
        // A leave goes on (at worst that member's calls to this worker
        // fail once it has stopped); a join fails and is undone.
        if (type == MessageType::kMemberLeave) continue;
      }
      refused = answer.status();
    } else if (answer->type == MessageType::kException) {
      refused = status_of_exception(*answer);
    }
    if (!refused.ok() && first_error.ok()) {
      first_error = absl::Status(
          refused.code(), absl::StrCat(named_worker(to[i]), " refused the ",
                                       message_type_name(type), " of '",
                                       self.name, "': ", refused.message()));
    }
  }
  return first_error;
}

absl::Status Worker::announce_join(join::MembershipToken& token,
                                   std::vector<WorkerInfo> members) {
  std::vector<WorkerInfo> gone;
  absl::Status told =
      tell_members(MessageType::kMemberJoin, members, gone);
  for (const WorkerInfo& lost_member : gone) {
    (void)token.forget(lost_member);
    members.erase(std::remove(members.begin(), members.end(), lost_member),
                  members.end());
    absl::MutexLock lock(&members_mu_);
    members_.erase(std::remove(members_.begin(), members_.end(), lost_member),
                   members_.end());
  }
  if (!told.ok()) {
    // Those that took this worker in are told it left.
    std::vector<WorkerInfo> ignored;
    (void)tell_members(MessageType::kMemberLeave, members, ignored);
    return told;
  }
  members.push_back(agent_->self());
  std::sort(members.begin(), members.end(),
            [](const WorkerInfo& a, const WorkerInfo& b) { return a.id < b.id; });
  return token.set_members(members);
}

absl::Status Worker::leave_group() {
  const WorkerInfo self = agent_->self();
  const absl::Time deadline =
      options_.shutdown_timeout <= absl::ZeroDuration() ||
              options_.shutdown_timeout == absl::InfiniteDuration()
          ? absl::InfiniteFuture()
          : absl::Now() + options_.shutdown_timeout;
  absl::StatusOr<std::unique_ptr<join::MembershipToken>> token =
      join::MembershipToken::acquire(
          store_, self, join::MembershipToken::Op::kLeave,
          options_.peer_timeout, deadline);
  if (!token.ok()) return token.status();
  // Off the list first: a later joiner does not tell this worker.
  absl::StatusOr<std::vector<WorkerInfo>> listed = (*token)->members();
  if (!listed.ok()) return listed.status();
  listed->erase(std::remove(listed->begin(), listed->end(), self),
                listed->end());
  if (absl::Status written = (*token)->set_members(*listed); !written.ok()) {
    return written;
  }
  std::vector<WorkerInfo> others;
  {
    absl::MutexLock lock(&members_mu_);
    for (const WorkerInfo& member : members_) {
      if (!(member == self)) others.push_back(member);
    }
  }
  std::vector<WorkerInfo> gone;
  absl::Status told = tell_members(MessageType::kMemberLeave, others, gone);
  for (const WorkerInfo& lost_member : gone) {
    (void)(*token)->forget(lost_member);
  }
  // No member calls this worker any more: what is left in flight is its
  // own calls and the requests it serves (each bounded by its timeout or
  // its peer's liveness).
  {
    absl::MutexLock lock(&members_mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(members_mu_) {
      return in_flight_ == 0 && serving_ == 0;
    };
    if (!members_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "worker '", self.name, "' timed out leaving the group after ",
          absl::FormatDuration(options_.shutdown_timeout), ": ", in_flight_,
          " call(s) of its own and ", serving_,
          " it serves still in flight"));
    }
  }
  if (absl::Status forgot = (*token)->forget(self); !forgot.ok()) {
    return forgot;
  }
  return told;
}

Future<Message> Worker::handle_membership(Message request) {
  const WorkerInfo& self = agent_->self();
  if (!dynamic_) {
    return Future<Message>::ready(exception_message(
        absl::FailedPreconditionError(absl::StrCat(
            "worker '", self.name, "' is in a static group (it was given a ",
            "world size): it takes no ", message_type_name(request.type)))));
  }
  absl::StatusOr<std::vector<WorkerInfo>> who =
      join::parse_members(request.payload);
  if (!who.ok() || who->size() != 1) {
    return Future<Message>::ready(exception_message(absl::InvalidArgumentError(
        absl::StrCat("worker '", self.name, "' got a malformed ",
                     message_type_name(request.type), ": ",
                     who.ok() ? "not exactly one worker" : who.status().message()))));
  }
  WorkerInfo info = (*who)[0];
  Promise<Message> promise;
  if (request.type == MessageType::kMemberJoin) {
    // The agent reads the joiner's address from the store: on the pool.
    pool_->run([this, promise, info] {
      bool known;
      {
        absl::MutexLock lock(&members_mu_);
        known = std::find(members_.begin(), members_.end(), info) !=
                members_.end();
      }
      // The same name and rank joining again: a rejoin (RpcOptions::rejoin)
      // in place of a lost incarnation, whose connections go first.
      if (known) agent_->remove_peer(info);
      absl::Status added = agent_->add_peer(info);
      if (added.ok()) {
        absl::MutexLock lock(&members_mu_);
        left_.erase(info.name);
        auto at = std::lower_bound(
            members_.begin(), members_.end(), info.id,
            [](const WorkerInfo& m, int rank) { return m.id < rank; });
        if (at == members_.end() || !(*at == info)) members_.insert(at, info);
      }
      promise.set(added.ok() ? ack() : exception_message(added));
    });
    return promise.future();
  }
  // A leave: no new call to it from now on; answered once this worker's
  // calls to it in flight are done.
  std::function<void()> done = [this, promise, info] {
    pool_->run([this, promise, info] {
      agent_->remove_peer(info);
      promise.set(ack());
    });
  };
  bool drained = true;
  {
    absl::MutexLock lock(&members_mu_);
    members_.erase(std::remove(members_.begin(), members_.end(), info),
                   members_.end());
    left_[info.name] = info;
    if (in_flight_to_.contains(info.id)) {
      drained = false;
      drained_waiters_.emplace_back(info.id, std::move(done));
    }
  }
  if (drained) done();
  return promise.future();
}

}  // namespace tether
