#include "backends/libfabric/internal/agent_state.h"

#include <absl/container/flat_hash_set.h>
#include <c10/util/Logging.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tether::backends::libfabric::internal {

namespace {

// How often the guard of the provider's TCP listener looks for strangers.
constexpr absl::Duration kGuardInterval = absl::Milliseconds(500);

// Whether process `pid` of this host has ended: gone, or dead and not yet
// reaped by its parent (a zombie; torchrun's agent reaps its workers only
// every 5 s). kill(pid, 0) alone takes a zombie for alive, and a call to a
// killed peer then waited for the peer timeout. (A main thread that ended
// while other threads run also shows as a zombie; its process has more
// than one thread left.)
bool process_ended(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat",
                static_cast<long long>(pid));
  std::FILE* file = std::fopen(path, "re");
  if (file == nullptr) return false;
  char stat[1024];
  const size_t n = std::fread(stat, 1, sizeof(stat) - 1, file);
  std::fclose(file);
  stat[n] = '\0';
  // "pid (comm) state ppid ... num_threads ...": comm may hold spaces and
  // parentheses; num_threads is the 17th field after the state.
  const char* close = std::strrchr(stat, ')');
  if (close == nullptr) return false;
  char state = 0;
  long threads = 0;
  if (std::sscanf(close + 1,
                  " %c %*d %*d %*d %*d %*d %*u %*lu %*lu %*lu %*lu %*lu "
                  "%*lu %*ld %*ld %*ld %*ld %ld",
                  &state, &threads) != 2) {
    return false;
  }
  return (state == 'Z' || state == 'X') && threads <= 1;
}

}  // namespace

void AgentState::heard_from(Peer& peer) {
  peer.last_heard = absl::Now();
  if (peer.lost && !peer.gone) {
    LOG(INFO) << who() << ": " << describe(peer.rank) << " is back";
    peer.lost.reset();
  }
}

void AgentState::fail_peer(int rank, const absl::Status& status) {
  if (sending_directly_) {
    // Inside a caller's send(): no future completes there (its callbacks
    // could take the caller's locks); the progress thread fails them.
    post([this, rank, status] { fail_peer(rank, status); });
    return;
  }
  Peer& peer = ranks_[rank];
  if (peer.lost) return;
  if (!peer.requests.empty() || !peer.transfers.empty() ||
      !peer.incoming.empty()) {
    LOG(WARNING) << who() << " fails what waits on " << describe(rank) << ": "
                 << status.message();
  }
  peer.lost = status;
  pending_.fail_connection(connection_of(peer), status);
  // A handshake in progress is abandoned; the next request starts anew.
  peer.auth_waiting.clear();
  peer.client_auth = Peer::ClientAuth::kNone;
  peer.client_handshake.reset();
  ++peer.epoch;
  peer.requests.clear();
  peer.queue.clear();
  for (uint64_t id : peer.transfers) transfers_.erase(id);
  peer.transfers.clear();
  // Their regions stay registered until their pulls in flight end.
  for (const std::shared_ptr<Arrival>& in : peer.incoming) {
    in->abandoned = true;
  }
  peer.incoming.clear();
  pulls_waiting_.erase(
      std::remove_if(pulls_waiting_.begin(), pulls_waiting_.end(),
                     [rank](const std::shared_ptr<Arrival>& in) {
                       return in->rank == rank;
                     }),
      pulls_waiting_.end());
  peer.expecting_since = absl::InfiniteFuture();
}

void AgentState::housekeeping(absl::Time now) {
  mr_cache_->drop_unheld();
  if (listener_guard_ != nullptr && now - last_guard_sweep_ >= kGuardInterval) {
    last_guard_sweep_ = now;
    const ListenerGuard::Swept swept = listener_guard_->sweep(now);
    if (swept.reset > 0) {
      stats_.strangers_reset += swept.reset;
      LOG(WARNING) << who() << " reset " << swept.reset
                   << " connection(s) to its TCP listener that made no "
                      "connection request ("
                   << swept.pending << " pending)";
    }
  }
  const bool prune = now - last_prune_ >= keepalive_interval_;
  if (prune) last_prune_ = now;
  // Our own thread may have stalled (a starved or stopped process): the
  // answers to keepalives sent before may be waiting unread, so they prove
  // nothing, and each peer is asked again before it can be lost.
  const bool we_stalled =
      last_housekeeping_ != absl::InfinitePast() &&
      now - last_housekeeping_ > keepalive_interval_;
  last_housekeeping_ = now;
  for (Peer& peer : ranks_) {
    if (absent(peer) || peer.rank == self_.id || peer.lost) continue;
    if (prune) {
      absl::erase_if(peer.requests,
                     [this](int64_t id) { return !pending_.contains(id); });
    }
    const bool expecting = !peer.requests.empty() || !peer.queue.empty() ||
                           !peer.transfers.empty() || !peer.incoming.empty();
    if (!expecting) {
      peer.expecting_since = absl::InfiniteFuture();
      continue;
    }
    if (peer.expecting_since == absl::InfiniteFuture()) {
      peer.expecting_since = now;
    }
    if (peer.same_host && peer.pid > 0 && process_ended(peer.pid)) {
      fail_peer(peer.rank,
                common::peer_lost(name_at(peer.rank), peer.rank,
                                  absl::StrCat("its process (pid ", peer.pid,
                                               ") is gone")));
      continue;
    }
    const absl::Time quiet_since = std::max(peer.last_heard, peer.expecting_since);
    const absl::Duration silence = now - quiet_since;
    if (we_stalled || peer.asked_at <= quiet_since) {
      peer.asked_at = absl::InfinitePast();  // not asked in this silence
    }
    // Silence alone is not proof (we may be the one who was away): a peer
    // is lost once the first keepalive of its silence has gone unanswered
    // for as long as a silent peer normally has to answer (the timeout less
    // the interval), counted in our own running time.
    const bool asked_in_vain =
        peer.asked_at != absl::InfinitePast() &&
        now - peer.asked_at >= settings_.peer_timeout - keepalive_interval_;
    if (silence > settings_.peer_timeout && asked_in_vain) {
      fail_peer(peer.rank,
                common::peer_lost(
                    name_at(peer.rank), peer.rank,
                    absl::StrCat("no word from it for ",
                                 absl::FormatDuration(silence), " while worker '",
                                 self_.name,
                                 "' waited on it (libfabric.peer_timeout_ms)")));
      continue;
    }
    if (silence >= keepalive_interval_ &&
        (now - peer.keepalive_sent >= keepalive_interval_ ||
         peer.asked_at == absl::InfinitePast())) {
      peer.keepalive_sent = now;
      if (peer.asked_at == absl::InfinitePast()) peer.asked_at = now;
      send_control(peer.rank, FrameKind::kKeepalive);
    }
  }
}

}  // namespace tether::backends::libfabric::internal
