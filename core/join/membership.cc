#include "core/join/membership.h"

#include <absl/random/random.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <exception>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>

namespace tether::join {
namespace {

constexpr char kMembersKey[] = "tether/members";
constexpr char kTokenKey[] = "tether/members/token";
constexpr char kBeatKey[] = "tether/members/beat";

std::vector<uint8_t> to_bytes(absl::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string from_bytes(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// "rank:name:op:nonce" -> the holder, or nullopt for a malformed value.
std::optional<WorkerInfo> holder_of(absl::string_view value) {
  std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  WorkerInfo who;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &who.id)) {
    return std::nullopt;
  }
  who.name = std::string(parts[1]);
  return who;
}

std::string describe_holder(absl::string_view value) {
  std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  if (parts.size() != 4) return absl::StrCat("'", value, "'");
  return absl::StrCat("worker '", parts[1], "' (rank ", parts[0], ", ",
                      parts[2] == "join" ? "joining" : "leaving", ")");
}

}  // namespace

absl::StatusOr<std::vector<WorkerInfo>> parse_members(absl::string_view text) {
  std::vector<WorkerInfo> members;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t colon = line.find(':');
    WorkerInfo info;
    if (colon == absl::string_view::npos || colon + 1 == line.size() ||
        !absl::SimpleAtoi(line.substr(0, colon), &info.id) || info.id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the group's member list holds '", line,
          "', which is not 'rank:name'"));
    }
    info.name = std::string(line.substr(colon + 1));
    members.push_back(std::move(info));
  }
  std::sort(members.begin(), members.end(),
            [](const WorkerInfo& a, const WorkerInfo& b) { return a.id < b.id; });
  return members;
}

std::string format_members(const std::vector<WorkerInfo>& members) {
  std::string out;
  for (const WorkerInfo& info : members) {
    absl::StrAppend(&out, info.id, ":", info.name, "\n");
  }
  return out;
}

MembershipToken::MembershipToken(std::shared_ptr<c10d::Store> store,
                                 WorkerInfo self, std::string value,
                                 absl::Duration beat_interval)
    : store_(std::move(store)), self_(std::move(self)), value_(std::move(value)) {
  beat_ = std::thread([this, beat_interval] {
    // The store client is thread-safe; a failed store ends the heartbeat
    // (the holder finds out on its own next call).
    try {
      while (!stop_.WaitForNotificationWithTimeout(beat_interval)) {
        store_->add(kBeatKey, 1);
      }
    } catch (const std::exception&) {
    }
  });
}

MembershipToken::~MembershipToken() {
  stop_.Notify();
  beat_.join();
  try {
    // Only if still ours: a holder taken for lost must not free another's.
    store_->compareSet(kTokenKey, to_bytes(value_), to_bytes(""));
  } catch (const std::exception&) {
  }
}

absl::StatusOr<std::unique_ptr<MembershipToken>> MembershipToken::acquire(
    std::shared_ptr<c10d::Store> store, const WorkerInfo& self, Op op,
    absl::Duration peer_timeout, absl::Time deadline,
    absl::Duration beat_interval) {
  absl::BitGen gen;
  const std::string mine = absl::StrCat(
      self.id, ":", self.name, ":", op == Op::kJoin ? "join" : "leave", ":",
      absl::Uniform<uint64_t>(gen));
  std::optional<WorkerInfo> lost;
  try {
    std::string seen;
    int64_t seen_beat = -1;
    absl::Time still_since = absl::Now();
    absl::Duration pause = absl::Milliseconds(1);
    while (true) {
      std::string holder =
          from_bytes(store->compareSet(kTokenKey, to_bytes(""), to_bytes(mine)));
      if (holder == mine) break;
      const int64_t beat = store->add(kBeatKey, 0);
      const absl::Time now = absl::Now();
      if (holder != seen || beat != seen_beat) {
        seen = holder;
        seen_beat = beat;
        still_since = now;
      } else if (now - still_since >= peer_timeout) {
        // The holder's heartbeat stood still for the peer timeout: it is
        // lost. Take over (unless another waiter just did).
        if (from_bytes(store->compareSet(kTokenKey, to_bytes(holder),
                                         to_bytes(mine))) == mine) {
          lost = holder_of(holder);
          break;
        }
      }
      if (now >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(named_worker(self), " timed out waiting to ",
                         op == Op::kJoin ? "join" : "leave",
                         " the group: the membership token is held by ",
                         describe_holder(holder), ", which is alive"));
      }
      absl::SleepFor(std::min(pause, deadline - now));
      pause = std::min(pause * 2, absl::Milliseconds(20));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        named_worker(self), ": the rendezvous store failed: ", e.what()));
  }
  std::unique_ptr<MembershipToken> token(
      new MembershipToken(std::move(store), self, mine, beat_interval));
  if (lost.has_value()) {
    token->lost_ = lost;
    if (absl::Status forgot = token->forget(*lost); !forgot.ok()) {
      return forgot;
    }
  }
  return token;
}

absl::StatusOr<std::vector<WorkerInfo>> MembershipToken::members() const {
  try {
    if (!store_->check({kMembersKey})) return std::vector<WorkerInfo>{};
    return parse_members(from_bytes(store_->get(kMembersKey)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("reading the group's members: the rendezvous store "
                     "failed: ",
                     e.what()));
  }
}

absl::Status MembershipToken::set_members(
    const std::vector<WorkerInfo>& members) {
  try {
    store_->set(kMembersKey, to_bytes(format_members(members)));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("writing the group's members: the rendezvous store "
                     "failed: ",
                     e.what()));
  }
}

absl::Status MembershipToken::claim() {
  const std::string rank = absl::StrCat(self_.id);
  try {
    std::string name_holder = from_bytes(store_->compareSet(
        absl::StrCat("tether/name/", self_.name), {}, to_bytes(rank)));
    if (name_holder != rank) {
      return absl::AlreadyExistsError(
          absl::StrCat("worker name '", self_.name,
                       "' is already taken by rank ", name_holder,
                       ": a worker's name is not unique"));
    }
    std::string rank_holder = from_bytes(store_->compareSet(
        absl::StrCat("tether/rank/", rank), {}, to_bytes(self_.name)));
    if (rank_holder != self_.name) {
      store_->deleteKey(absl::StrCat("tether/name/", self_.name));
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", rank, " is already taken by worker '", rank_holder, "'"));
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "claiming name and rank: the rendezvous store failed: ", e.what()));
  }
}

absl::Status MembershipToken::forget(const WorkerInfo& who) {
  const std::string rank = absl::StrCat(who.id);
  try {
    const std::string name_key = absl::StrCat("tether/name/", who.name);
    const std::string rank_key = absl::StrCat("tether/rank/", rank);
    if (store_->check({name_key}) && from_bytes(store_->get(name_key)) == rank) {
      store_->deleteKey(name_key);
    }
    if (store_->check({rank_key}) &&
        from_bytes(store_->get(rank_key)) == who.name) {
      store_->deleteKey(rank_key);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "freeing name and rank: the rendezvous store failed: ", e.what()));
  }
  absl::StatusOr<std::vector<WorkerInfo>> list = members();
  if (!list.ok()) return list.status();
  const size_t before = list->size();
  list->erase(std::remove(list->begin(), list->end(), who), list->end());
  if (list->size() == before) return absl::OkStatus();
  return set_members(*list);
}

}  // namespace tether::join
