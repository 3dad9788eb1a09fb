#include "backends/libfabric/internal/agent_state.h"

#include <c10/util/Logging.h>
#include <poll.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "backends/libfabric/internal/shared_endpoints.h"

namespace tether::backends::libfabric::internal {

thread_local const void* t_progress_of = nullptr;

namespace {

constexpr int kCompletionBatch = 32;
constexpr absl::Duration kGoodbyeBound = absl::Milliseconds(200);
constexpr absl::Duration kPollSleepMin = absl::Microseconds(50);
constexpr absl::Duration kPollSleepMax = absl::Milliseconds(1);
constexpr absl::Duration kShortestNap = absl::Microseconds(500);
constexpr absl::Duration kLongestNap = absl::Milliseconds(20);

}  // namespace

void AgentState::run() {
  drive_mu_.Lock();
  driving_ = true;
  t_progress_of = this;
  absl::Time last_work = absl::Now();
  absl::Time next_tick = last_work + tick_;
  absl::Duration poll_sleep = kPollSleepMin;
  absl::Duration nap = kShortestNap;
  bool woke_by_timeout = false;
  while (true) {
    bool stop = false;
    bool worked = run_commands(&stop);
    if (stop) break;
    const bool completed = poll_completions();
    if (completed && woke_by_timeout) ++stats_.late_wakeups;
    woke_by_timeout = false;
    worked |= completed;
    worked |= pump();
    const absl::Time now = absl::Now();
    if (now >= next_tick) {
      housekeeping(now);
      next_tick = now + tick_;
    }
    if (worked) {
      last_work = now;
      poll_sleep = kPollSleepMin;
      nap = kShortestNap;
      continue;
    }
    if (now - last_work < spin_) {
      // Polls again, but lets a thread waiting for this core run first.
      std::this_thread::yield();
      continue;
    }
    woke_by_timeout = idle(next_tick, &poll_sleep, &nap);
  }
  teardown();
  torn_down_ = true;
  t_progress_of = nullptr;
  drive_mu_.Unlock();
}

bool AgentState::run_commands(bool* stop) {
  std::deque<std::function<void()>> batch;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      *stop = true;
      return false;
    }
    batch.swap(commands_);
  }
  for (std::function<void()>& command : batch) command();
  return !batch.empty();
}

bool AgentState::idle(absl::Time next_tick, absl::Duration* poll_sleep,
                 absl::Duration* nap) {
  absl::Duration timeout =
      std::max(absl::ZeroDuration(), next_tick - absl::Now());
  // Operations refused with FI_EAGAIN (a connection being made, a full
  // queue) are tried again soon, whatever wakes us.
  if (refused_) timeout = std::min(timeout, absl::Milliseconds(1));
  // While something waits on a peer or on the provider, sleep in short but
  // growing naps even where a wake-up should come: a provider that buffers
  // what it read off a socket may not signal its descriptor again, and a
  // lost wake-up must cost a nap, not a tick.
  if (waiting()) {
    timeout = std::min(timeout, *nap);
    *nap = std::min(*nap * 2, kLongestNap);
  }
  const bool polled = fabric_->wait_fd() < 0;
  if (polled) {
    // Sleep until a peer rings when every peer can and nothing of ours is
    // in flight (our own operations only progress while we poll);
    // otherwise poll, less and less often.
    const bool rung = doorbell_fd_ >= 0 && all_peers_ring_ &&
                      tx_inflight_ == 0 && rx_inflight_ == 0 &&
                      retry_.empty() && !refused_;
    if (rung) {
      // Drain the rings, then look once more: a frame that arrives after
      // this look rings again.
      char rings[64];
      while (::recv(doorbell_fd_, rings, sizeof(rings), MSG_DONTWAIT) > 0) {
      }
      if (poll_completions()) return false;
    } else {
      timeout = std::min(timeout, *poll_sleep);
      *poll_sleep = std::min(*poll_sleep * 2, kPollSleepMax);
    }
  }
  refused_ = false;
  bool ran_out = false;
  sleeping_.store(true);
  if (!has_commands()) {
    // The drive token is free while this thread sleeps: a thread waiting
    // for its answer may drive the queue meanwhile (the assist).
    if (polled) {
      pollfd wakeups[2] = {{event_fd_, POLLIN, 0}, {doorbell_fd_, POLLIN, 0}};
      const timespec wait = absl::ToTimespec(timeout);
      drive_mu_.Unlock();
      ran_out = ::ppoll(wakeups, doorbell_fd_ >= 0 ? 2 : 1, &wait, nullptr) == 0;
      drive_mu_.Lock();
    } else {
      fid* fids[] = {&fabric_->cq()->fid};
      if (fi_trywait(fabric_->fabric(), fids, 1) == FI_SUCCESS) {
        epoll_event events[2];
        const int ms = static_cast<int>(
            absl::ToInt64Milliseconds(timeout + absl::Microseconds(999)));
        drive_mu_.Unlock();
        ran_out = ::epoll_wait(epoll_fd_, events, 2, ms) == 0;
        drive_mu_.Lock();
      }
    }
  }
  sleeping_.store(false);
  uint64_t count = 0;
  [[maybe_unused]] ssize_t got = ::read(event_fd_, &count, sizeof(count));
  return ran_out;
}

// ---- the assist

namespace {

// Rounds of work an assisting thread does when it starts, before it polls
// the descriptor; a queue still busy after them is left to the progress
// thread.
constexpr int kAssistStartRounds = 64;


// While a thread other than the progress thread drives the queue.
class Driving {
 public:
  explicit Driving(const void* state)
      : outer_(std::exchange(t_progress_of, state)) {}
  ~Driving() { t_progress_of = outer_; }

 private:
  const void* const outer_;
};

}  // namespace

int AgentState::begin_assist() {
  if (cq_fd_ < 0 || t_progress_of == this) return -1;
  {
    absl::MutexLock lock(&assist_mu_);
    if (assistants_++ == 0) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, cq_fd_, nullptr);
    }
  }
  // The descriptor only signals what comes after an fi_trywait that
  // succeeded. If the progress thread holds the token, it is working and
  // calls fi_trywait before it sleeps again; otherwise this thread does.
  if (!drive_mu_.TryLock()) return cq_fd_;
  Drove drove = Drove::kStopped;
  if (driving_ && !torn_down_) {
    Driving driving(this);
    for (int round = 0; round < kAssistStartRounds; ++round) {
      drove = drive_once();
      if (drove != Drove::kWorked) break;
    }
  }
  drive_mu_.Unlock();
  if (drove == Drove::kIdle) return cq_fd_;
  end_assist();
  return -1;
}

bool AgentState::assist_step() {
  absl::MutexLock token(&drive_mu_);
  if (torn_down_) return false;
  Driving driving(this);
  for (;;) {
    switch (drive_once()) {
      case Drove::kIdle:
        return true;
      case Drove::kStopped:
        return false;
      case Drove::kWorked:
        break;
    }
  }
}

bool AgentState::send_directly(int rank, int64_t id, Message& request) {
  if (!drive_mu_.TryLock()) return false;
  bool sent = false;
  bool more = false;
  if (driving_ && !torn_down_ && !has_commands() && installed(rank)) {
    const Peer& peer = ranks_[rank];
    // An eager frame that goes at once: nothing queued before it to the
    // peer (a thread's requests leave in order), no rendezvous or handshake
    // to start, a credit and a send buffer free.
    // The frame as send_message() lays it out, every segment inline.
    std::vector<SegmentDesc> segments(1 + request.storages.size());
    segments[0].size = request.payload.size();
    bool small = segments[0].size < threshold_;
    for (size_t i = 0; i < request.storages.size(); ++i) {
      segments[i + 1].size = request.storages[i].nbytes();
      small = small && segments[i + 1].size < threshold_;
    }
    const uint64_t frame_bytes = framing::kHeaderSize +
                                 framing::kMessageHeadSize +
                                 framing::body_size(segments);
    if (small && frame_bytes <= peer.buffer_size && !peer.lost &&
        peer.queue.empty() && peer.credits > 0 &&
        (!auth_ || peer.client_auth == Peer::ClientAuth::kReady) &&
        !free_send_buffers_.empty() && have_tx_room()) {
      Driving driving(this);
      sending_directly_ = true;
      start_request(rank, id, std::move(request));
      sending_directly_ = false;
      sent = true;
      // Refused by the provider meanwhile (queued): the progress thread
      // sends it, if this thread does not wait and assist.
      more = refused_ || !queued_ranks_.empty();
    }
  }
  drive_mu_.Unlock();
  if (more) wake();
  return sent;
}

void AgentState::end_assist() {
  {
    absl::MutexLock lock(&assist_mu_);
    if (--assistants_ > 0) return;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = cq_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, cq_fd_, &event);
  }
  // What the assist leaves to do, the progress thread does (it may be
  // asleep until its next tick); if it holds the token, it is at work.
  if (!drive_mu_.TryLock()) return;
  const bool more = !torn_down_ && (waiting() || refused_);
  drive_mu_.Unlock();
  if (more) wake();
}

AgentState::Drove AgentState::drive_once() {
  bool stop = false;
  bool worked = run_commands(&stop);
  if (stop) return Drove::kStopped;
  worked |= poll_completions();
  worked |= pump();
  if (worked) return Drove::kWorked;
  fid* fids[] = {&fabric_->cq()->fid};
  return fi_trywait(fabric_->fabric(), fids, 1) == FI_SUCCESS ? Drove::kIdle
                                                               : Drove::kWorked;
}

bool AgentState::waiting() {
  return !queued_ranks_.empty() || !credit_due_.empty() ||
         !transfers_.empty() || !inflight_.empty() ||
         !pulls_waiting_.empty() || !sends_waiting_.empty() ||
         pending_.size() > 0;
}

bool AgentState::poll_completions() {
  fi_cq_tagged_entry entries[kCompletionBatch];
  const ssize_t n = fi_cq_read(fabric_->cq(), entries, kCompletionBatch);
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      on_completion(static_cast<OpContext*>(entries[i].op_context)->op,
                    entries[i].len);
    }
    return true;
  }
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry error{};
    if (fi_cq_readerr(fabric_->cq(), &error, 0) == 1) on_error(error);
    return true;
  }
  if (n != -FI_EAGAIN) {
    LOG(WARNING) << who() << ": fi_cq_read failed: "
                 << libfabric::internal::fi_error_text(static_cast<int>(-n));
  }
  return false;
}

int AgentState::issue(Op* op) {
  fid_ep* ep = fabric_->ep();
  const fi_addr_t address =
      op->rank >= 0 ? ranks_[op->rank].address : FI_ADDR_UNSPEC;
  ssize_t rc = 0;
  switch (op->kind) {
    case OpKind::kEagerReceive:
      rc = fi_trecv(ep, op->buffer, op->length, op->desc, FI_ADDR_UNSPEC,
                    op->tag, framing::kEagerIgnore, &op->context);
      break;
    case OpKind::kEagerSend:
    case OpKind::kBulkSend:
      rc = fi_tsend(ep, op->buffer, op->length, op->desc, address, op->tag,
                    &op->context);
      break;
    case OpKind::kRead:
      rc = fi_read(ep, op->buffer, op->length, op->desc, address,
                   op->remote_address, op->key, &op->context);
      break;
    case OpKind::kBulkReceive:
      rc = fi_trecv(ep, op->buffer, op->length, op->desc, FI_ADDR_UNSPEC,
                    op->tag, 0, &op->context);
      break;
  }
  return static_cast<int>(rc);
}

void AgentState::post_receive(Op* op) {
  const int rc = issue(op);
  if (rc == -FI_EAGAIN) {
    refused_ = true;
    retry_.push_back(op);
  } else if (rc != 0) {
    LOG(ERROR) << who() << " cannot re-post an eager buffer: "
               << libfabric::internal::fi_error_text(-rc);
  }
}

void AgentState::on_completion(Op* op, size_t length) {
  switch (op->kind) {
    case OpKind::kEagerReceive:
      on_frame(op, length);
      post_receive(op);
      return;
    case OpKind::kEagerSend:
      --tx_inflight_;
      free_send_buffers_.push_back(op->slot);
      return;
    case OpKind::kRead:
    case OpKind::kBulkReceive:
      on_pulled(op, absl::OkStatus());
      return;
    case OpKind::kBulkSend:
      --tx_inflight_;
      inflight_.erase(op);
      delete op;
      return;
  }
}

void AgentState::on_error(const fi_cq_err_entry& error) {
  Op* op = static_cast<OpContext*>(error.op_context)->op;
  char text[256] = {0};
  const char* detail = fi_cq_strerror(fabric_->cq(), error.prov_errno,
                                      error.err_data, text, sizeof(text));
  const std::string reason =
      absl::StrCat(libfabric::internal::fi_error_text(error.err),
                   detail != nullptr && detail[0] != '\0'
                       ? absl::StrCat(": ", detail)
                       : std::string());
  switch (op->kind) {
    case OpKind::kEagerReceive:
      if (error.err != FI_ECANCELED) {
        LOG(WARNING) << who() << ": an eager receive failed: " << reason;
      }
      post_receive(op);
      return;
    case OpKind::kEagerSend: {
      --tx_inflight_;
      free_send_buffers_.push_back(op->slot);
      fail_peer(op->rank,
                absl::UnavailableError(absl::StrCat(
                    "libfabric send from worker '", self_.name, "' to ",
                    describe(op->rank), " failed: ", reason)));
      return;
    }
    case OpKind::kRead:
    case OpKind::kBulkReceive:
      on_pulled(op, absl::UnavailableError(absl::StrCat(
                        "libfabric ",
                        op->kind == OpKind::kRead ? "read" : "bulk receive",
                        " by worker '", self_.name, "' from ",
                        describe(op->rank), " failed: ", reason)));
      return;
    case OpKind::kBulkSend: {
      --tx_inflight_;
      const int rank = op->rank;
      inflight_.erase(op);
      delete op;
      fail_peer(rank, absl::UnavailableError(absl::StrCat(
                          "libfabric bulk send from worker '", self_.name,
                          "' to ", describe(rank), " failed: ", reason)));
      return;
    }
  }
}

bool AgentState::pump() {
  bool worked = false;
  while (!retry_.empty()) {
    Op* op = retry_.front();
    const int rc = issue(op);
    if (rc == -FI_EAGAIN) {
      refused_ = true;
      break;
    }
    retry_.pop_front();
    worked = true;
    if (rc != 0) {
      LOG(ERROR) << who() << " cannot re-post an eager buffer: "
                 << libfabric::internal::fi_error_text(-rc);
    }
  }
  if (!sends_waiting_.empty()) worked |= pump_sends();
  for (size_t n = pulls_waiting_.size(); n > 0 && retry_.empty(); --n) {
    std::shared_ptr<Arrival> in = std::move(pulls_waiting_.front());
    pulls_waiting_.pop_front();
    const size_t before = in->next_chunk;
    pump_pull(in);
    worked |= in->next_chunk != before;
  }
  if (!queued_ranks_.empty()) {
    std::vector<int> ranks;
    ranks.swap(queued_ranks_);
    for (int rank : ranks) {
      Peer& peer = ranks_[rank];
      peer.queued_listed = false;
      worked |= flush(peer);
      if (!peer.queue.empty() && !peer.queued_listed) {
        peer.queued_listed = true;
        queued_ranks_.push_back(rank);
      }
    }
  }
  if (!credit_due_.empty()) worked |= send_due_credits();
  return worked;
}

void AgentState::teardown() {
  if (fabric_ != nullptr && fabric_->ep() != nullptr && !ranks_.empty() &&
      !send_ops_.empty()) {
    // Goodbyes, so that peers fail what waits for us at once.
    size_t said = 0;
    for (Peer& peer : ranks_) {
      if (absent(peer) || peer.rank == self_.id || !peer.talked || peer.lost) {
        continue;
      }
      OutFrame out;
      out.header.kind = FrameKind::kGoodbye;
      if (transmit(peer, out, /*control=*/peer.control_slot_free) ==
          Sent::kSent) {
        ++said;
      }
    }
    const absl::Time deadline = absl::Now() + kGoodbyeBound;
    while (said > 0 && free_send_buffers_.size() < kSendBuffers &&
           absl::Now() < deadline) {
      fi_cq_tagged_entry entries[kCompletionBatch];
      const ssize_t n = fi_cq_read(fabric_->cq(), entries, kCompletionBatch);
      for (ssize_t i = 0; i < n; ++i) {
        Op* op = static_cast<OpContext*>(entries[i].op_context)->op;
        if (op->kind == OpKind::kEagerSend) free_send_buffers_.push_back(op->slot);
      }
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry error{};
        fi_cq_readerr(fabric_->cq(), &error, 0);
        Op* op = static_cast<OpContext*>(error.op_context)->op;
        if (op->kind == OpKind::kEagerSend) free_send_buffers_.push_back(op->slot);
      }
    }
  }
  // shm endpoints of one process use each other's memory: ours may have to
  // stay open, idle, until the process's last one closes.
  const bool shared =
      fabric_ != nullptr && fabric_->provider_name() == "shm";
  const bool park = shared && SharedEndpoints::get().others_open();
  // Unless parked, libfabric holds none of our buffers from here on; if
  // parked, it never looks at them again (nobody progresses the endpoint).
  if (fabric_ != nullptr && !park) fabric_->close_endpoint();
  for (Op* op : inflight_) delete op;
  inflight_.clear();
  retry_.clear();  // eager buffers only, owned by receive_ops_
  pulls_waiting_.clear();
  sends_waiting_.clear();
  for (Peer& peer : ranks_) {
    peer.queue.clear();
    peer.transfers.clear();
    peer.incoming.clear();
  }
  transfers_.clear();
  mr_cache_.reset();
  auto endpoint = std::make_unique<ClosedEndpoint>();
  endpoint->receive_ops = std::move(receive_ops_);
  endpoint->send_ops = std::move(send_ops_);
  endpoint->receive_regions = std::move(receive_regions_);
  endpoint->send_region = std::move(send_region_);
  endpoint->receive_slabs = std::move(receive_slabs_);
  endpoint->send_slab = std::move(send_slab_);
  endpoint->fabric = std::move(fabric_);
  if (shared) {
    SharedEndpoints::get().close(std::move(endpoint));
  } else {
    endpoint->close();
  }
}

}  // namespace tether::backends::libfabric::internal
