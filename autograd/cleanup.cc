// The cleanup of distributed autograd contexts: a context left on one
// worker is released there and on every worker it exchanged messages with.

#include "autograd/internal/state.h"

#include <absl/strings/str_cat.h>
#include <glog/logging.h>

#include "autograd/messages.h"

namespace tether::autograd::internal {

namespace {

// Completes with the first error among `futures`, or OK once all are done.
Future<bool> all_of(const std::vector<Future<bool>>& futures) {
  if (futures.empty()) return Future<bool>::ready(true);
  Promise<bool> done;
  auto left = std::make_shared<std::atomic<size_t>>(futures.size());
  for (Future<bool> future : futures) {
    future.on_complete([done, left](const absl::StatusOr<bool>& result) {
      if (!result.ok()) done.set(result.status());
      if (left->fetch_sub(1) == 1) done.set(true);
    });
  }
  return done.future();
}

}  // namespace

Future<bool> AutogradState::cleanup(int64_t id, int32_t from) {
  std::shared_ptr<ContextRecord> record;
  {
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(id);
    if (it == contexts_.end()) return Future<bool>::ready(true);
    record = std::move(it->second);
    contexts_.erase(it);
  }
  std::vector<int32_t> peers;
  {
    absl::MutexLock lock(&record->mu);
    peers.assign(record->peers.begin(), record->peers.end());
  }
  record.reset();  // the graph this context kept alive goes now
  std::vector<Future<bool>> sent;
  with_worker([&](Worker& worker) {
    for (int32_t peer : peers) {
      if (peer == from) continue;
      absl::StatusOr<WorkerInfo> to = worker.get_worker_info(To(peer));
      if (!to.ok()) continue;
      Message request;
      request.type = kAutogradCleanup;
      absl::Status encoded = worker.encode(
          c10::ivalue::Tuple::create(
              {c10::IValue(id), c10::IValue(int64_t{self_.id})}),
          request);
      if (!encoded.ok()) continue;
      sent.push_back(worker.send(*to, std::move(request))
                         .then([](const absl::StatusOr<Message>& response)
                                   -> absl::StatusOr<bool> {
                           if (!response.ok()) return response.status();
                           return true;
                         }));
    }
  });
  return all_of(sent);
}

void AutogradState::release(int64_t id) {
  {
    absl::MutexLock lock(&releases_mu_);
    ++releases_in_flight_;
  }
  std::weak_ptr<AutogradState> weak = weak_from_this();
  cleanup(id, -1).on_complete([weak, id](const absl::StatusOr<bool>& done) {
    if (!done.ok()) {
      LOG(WARNING) << "releasing distributed autograd context " << id
                   << " on every worker: " << done.status();
    }
    if (std::shared_ptr<AutogradState> self = weak.lock()) {
      absl::MutexLock lock(&self->releases_mu_);
      --self->releases_in_flight_;
    }
  });
}

absl::Status AutogradState::await_releases(absl::Time deadline) {
  absl::MutexLock lock(&releases_mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(releases_mu_) {
    return releases_in_flight_ == 0;
  };
  if (releases_mu_.AwaitWithDeadline(absl::Condition(&none), deadline)) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat(
      releases_in_flight_, " release",
      releases_in_flight_ == 1 ? "" : "s",
      " of distributed autograd contexts still in flight on worker ",
      describe(self_)));
}

Future<Message> AutogradState::on_cleanup(Message request) {
  absl::StatusOr<c10::IValue> payload = absl::CancelledError("shut down");
  with_worker([&](Worker& w) { payload = w.decode(request); });
  if (!payload.ok()) return Future<Message>::ready(payload.status());
  if (!payload->isTuple() || payload->toTupleRef().elements().size() != 2 ||
      !payload->toTupleRef().elements()[0].isInt() ||
      !payload->toTupleRef().elements()[1].isInt()) {
    return Future<Message>::ready(absl::InvalidArgumentError(
        "malformed AUTOGRAD_CLEANUP: expected (int, int)"));
  }
  const auto& parts = payload->toTupleRef().elements();
  return cleanup(parts[0].toInt(), static_cast<int32_t>(parts[1].toInt()))
      .then([](const absl::StatusOr<bool>& done) -> absl::StatusOr<Message> {
        // Peers that are gone cannot hold the context any more.
        if (!done.ok()) VLOG(1) << "autograd cleanup: " << done.status();
        return ack();
      });
}

}  // namespace tether::autograd::internal
