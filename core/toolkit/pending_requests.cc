#include "core/toolkit/pending_requests.h"

#include <absl/strings/str_cat.h>

#include <string>
#include <utility>
#include <vector>

namespace tether::internal {

PendingRequests::PendingRequests(TimerQueue* timers)
    : table_(std::make_shared<Table>(timers)) {}

PendingRequests::~PendingRequests() {
  absl::flat_hash_map<Id, Entry> entries;
  {
    absl::MutexLock lock(&table_->mu);
    // The timers are left alone (the queue may be gone): they will find
    // nothing.
    entries.swap(table_->entries);
  }
  for (auto& [id, entry] : entries) {
    entry.promise.set(absl::CancelledError(
        "the agent dropped its pending requests without cancelling them"));
  }
}

absl::StatusOr<PendingRequests::Request> PendingRequests::add(
    absl::Duration timeout, MessageType type, absl::string_view peer) {
  Promise<Message> promise;
  Request request;
  request.response = promise.future();
  absl::MutexLock lock(&table_->mu);
  if (table_->closed.has_value()) return *table_->closed;
  request.id = table_->next_id++;
  Entry& entry =
      table_->entries.try_emplace(request.id, Entry{std::move(promise)})
          .first->second;
  entry.peer = std::string(peer);
  entry.added = absl::Now();
  entry.ping = type == MessageType::kPing;
  if (entry.ping) ++table_->pings;
  if (timeout != absl::InfiniteDuration()) {
    // Scheduled under the lock, so the entry knows its timer before the
    // timer can look for the entry.
    entry.timer = table_->timers->schedule(
        entry.added + timeout,
        [weak = std::weak_ptr<Table>(table_), id = request.id, type, timeout] {
          if (std::shared_ptr<Table> table = weak.lock()) {
            time_out(*table, id, type, timeout);
          }
        });
  }
  return request;
}

void PendingRequests::time_out(Table& table, Id id, MessageType type,
                               absl::Duration timeout) {
  std::optional<Promise<Message>> promise;
  std::string peer;
  {
    absl::MutexLock lock(&table.mu);
    auto it = table.entries.find(id);
    if (it == table.entries.end()) return;
    // The words are made only now: the entry has the peer's name, so the
    // timer of every request need not carry a copy.
    peer = it->second.peer;
    promise = table.take(id);
  }
  promise->set(absl::DeadlineExceededError(
      absl::StrCat(message_type_name(type), " request to worker '", peer,
                   "' timed out after ", absl::FormatDuration(timeout))));
}

bool PendingRequests::set_connection(Id id, Connection connection) {
  absl::MutexLock lock(&table_->mu);
  auto it = table_->entries.find(id);
  if (it == table_->entries.end()) return false;
  it->second.connection = connection;
  return true;
}

bool PendingRequests::contains(Id id) const {
  absl::MutexLock lock(&table_->mu);
  return table_->entries.contains(id);
}

bool PendingRequests::complete(Id id, absl::StatusOr<Message> result) {
  return finish(*table_, id, std::move(result));
}

template <typename Pick>
void PendingRequests::fail_where(const Pick& pick, const absl::Status& status) {
  std::vector<Promise<Message>> failed;
  {
    absl::MutexLock lock(&table_->mu);
    std::vector<Id> ids;
    for (const auto& [id, entry] : table_->entries) {
      if (pick(entry)) ids.push_back(id);
    }
    for (Id id : ids) failed.push_back(*table_->take(id));
  }
  for (Promise<Message>& promise : failed) promise.set(status);
}

void PendingRequests::fail_connection(Connection connection,
                                      const absl::Status& status) {
  fail_where(
      [connection](const Entry& entry) {
        return entry.connection == connection;
      },
      status);
}

void PendingRequests::fail_peer(absl::string_view peer,
                                const absl::Status& status) {
  fail_where([peer](const Entry& entry) { return entry.peer == peer; },
             status);
}

std::vector<std::pair<std::string, absl::Time>>
PendingRequests::waiting_since() const {
  absl::flat_hash_map<std::string, absl::Time> oldest;
  {
    absl::MutexLock lock(&table_->mu);
    for (const auto& [id, entry] : table_->entries) {
      if (entry.ping) continue;
      auto [it, fresh] = oldest.try_emplace(entry.peer, entry.added);
      if (!fresh && entry.added < it->second) it->second = entry.added;
    }
  }
  return {oldest.begin(), oldest.end()};
}

void PendingRequests::cancel_all(const absl::Status& status) {
  std::vector<Promise<Message>> cancelled;
  {
    absl::MutexLock lock(&table_->mu);
    if (table_->closed.has_value()) return;
    table_->closed = status;
    for (auto& [id, entry] : table_->entries) {
      if (entry.timer != 0) table_->timers->cancel(entry.timer);
      cancelled.push_back(std::move(entry.promise));
    }
    table_->entries.clear();
    table_->pings = 0;
  }
  for (Promise<Message>& promise : cancelled) promise.set(status);
}

size_t PendingRequests::size() const {
  absl::MutexLock lock(&table_->mu);
  return table_->entries.size();
}

bool PendingRequests::wait_until_empty(absl::Time deadline) const {
  Table& table = *table_;
  absl::MutexLock lock(&table.mu);
  auto empty = [&table]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu) {
    return table.entries.empty();
  };
  return table.mu.AwaitWithDeadline(absl::Condition(&empty), deadline);
}

size_t PendingRequests::calls() const {
  absl::MutexLock lock(&table_->mu);
  return table_->entries.size() - table_->pings;
}

bool PendingRequests::wait_until_no_calls(absl::Time deadline) const {
  Table& table = *table_;
  absl::MutexLock lock(&table.mu);
  auto none = [&table]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu) {
    return table.entries.size() == table.pings;
  };
  return table.mu.AwaitWithDeadline(absl::Condition(&none), deadline);
}

std::optional<Promise<Message>> PendingRequests::Table::take(Id id) {
  auto it = entries.find(id);
  if (it == entries.end()) return std::nullopt;
  // Under the lock: cancel_all() then knows the queue is no longer used.
  if (it->second.timer != 0) timers->cancel(it->second.timer);
  Promise<Message> promise = std::move(it->second.promise);
  if (it->second.ping) --pings;
  entries.erase(it);
  return promise;
}

bool PendingRequests::finish(Table& table, Id id,
                             absl::StatusOr<Message> result) {
  std::optional<Promise<Message>> promise;
  {
    absl::MutexLock lock(&table.mu);
    promise = table.take(id);
  }
  if (!promise.has_value()) return false;
  promise->set(std::move(result));
  return true;
}

}  // namespace tether::internal
