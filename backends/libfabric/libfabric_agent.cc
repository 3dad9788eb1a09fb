#include "backends/libfabric/libfabric_agent.h"

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/escaping.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Logging.h>
#include <poll.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/common/agent_support.h"
#include "backends/common/peer_table.h"
#include "backends/libfabric/internal/fabric.h"
#include "backends/libfabric/internal/frame.h"
#include "backends/libfabric/internal/listener_guard.h"
#include "backends/libfabric/internal/mr_cache.h"
#include "backends/libfabric/internal/settings.h"
#include "core/auth/auth.h"
#include "core/internal/check.h"
#include "core/internal/pending_requests.h"
#include "core/internal/timer.h"
#include "core/join/store_join.h"

namespace tether::backends {
namespace {

using libfabric::internal::AuthFrame;
using libfabric::internal::AuthStep;
using libfabric::internal::Body;
using libfabric::internal::Chunk;
using libfabric::internal::Fabric;
using libfabric::internal::FabricOptions;
using libfabric::internal::FrameHeader;
using libfabric::internal::FrameKind;
using libfabric::internal::ListenerGuard;
using libfabric::internal::MemoryRegion;
using libfabric::internal::MessageHead;
using libfabric::internal::MrCache;
using libfabric::internal::RendezvousMode;
using libfabric::internal::SegmentDesc;
using libfabric::internal::Settings;
using tether::internal::PendingRequests;
using tether::internal::TimerQueue;

namespace frame = libfabric::internal;

constexpr char kBackendName[] = "libfabric";
constexpr char kAddressKeyPrefix[] = "tether/libfabric/";

// Eager buffers hold the rendezvous threshold plus this much for the
// headers and segment descriptors.
constexpr uint64_t kBufferSlack = 1024;
// An inject size from which eager frames are held to it (see open_fabric()).
constexpr size_t kUsefulInjectSize = 2048;
constexpr size_t kSendBuffers = 64;
// Large buffers move in pieces of at most this many bytes.
constexpr uint64_t kMaxChunk = uint64_t{16} << 20;
// Receive-queue entries kept for tagged bulk receives.
constexpr size_t kBulkReceiveReserve = 64;
// A dynamic group's agent sizes its credits for at least this many workers.
constexpr size_t kDynamicPlannedPeers = 8;
constexpr int kCompletionBatch = 32;
constexpr absl::Duration kMaxTick = absl::Milliseconds(100);
constexpr absl::Duration kGoodbyeBound = absl::Milliseconds(200);
constexpr absl::Duration kPollSleepMin = absl::Microseconds(50);
constexpr absl::Duration kPollSleepMax = absl::Milliseconds(1);
constexpr absl::Duration kShortestNap = absl::Microseconds(500);
constexpr absl::Duration kLongestNap = absl::Milliseconds(20);
constexpr absl::Duration kStatsBound = absl::Seconds(10);
// How often the guard of the provider's TCP listener looks for strangers.
constexpr absl::Duration kGuardInterval = absl::Milliseconds(500);

// Which agent's progress thread this is (nullptr: none).
thread_local const void* t_progress_of = nullptr;

// ------------------------------------------------------------ the record

// What a worker publishes in the store for its peers.
struct Record {
  std::string provider;
  std::string address;  // the endpoint's name, raw
  uint64_t buffer_size = 0;
  uint32_t credits = 0;
  RendezvousMode mode = RendezvousMode::kRead;  // read or tagged
  int64_t pid = 0;
  // Equal values mean pids and abstract sockets can be shared (see
  // host_identity()).
  std::string host;
  // Where same-host peers ring to wake a polling progress thread: an
  // abstract Unix socket name, raw (empty: none).
  std::string doorbell;
  // The worker's name (dynamic groups: a member learns a joiner's name
  // from it when the joiner's first frame comes before MEMBER_JOIN).
  std::string name;
};

std::string encode_record(const Record& record) {
  return absl::StrCat(
      "provider=", record.provider, "\naddress=",
      absl::BytesToHexString(record.address), "\nbuffer=", record.buffer_size,
      "\ncredits=", record.credits, "\nrendezvous=",
      rendezvous_mode_name(record.mode), "\npid=", record.pid,
      "\nhost=", record.host, "\ndoorbell=",
      absl::BytesToHexString(record.doorbell), "\nname=",
      absl::BytesToHexString(record.name), "\n");
}

absl::StatusOr<Record> decode_record(absl::string_view text) {
  Record record;
  int fields = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> entry =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    const absl::string_view key = entry.first;
    const absl::string_view value = entry.second;
    bool ok = true;
    if (key == "provider") {
      record.provider = std::string(value);
    } else if (key == "address") {
      record.address = absl::HexStringToBytes(value);
      ok = value.size() % 2 == 0 && !record.address.empty();
    } else if (key == "buffer") {
      ok = absl::SimpleAtoi(value, &record.buffer_size) &&
           record.buffer_size >= frame::kHeaderSize + frame::kMessageHeadSize;
    } else if (key == "credits") {
      ok = absl::SimpleAtoi(value, &record.credits) && record.credits > 0;
    } else if (key == "rendezvous") {
      ok = value == "read" || value == "tagged";
      record.mode =
          value == "read" ? RendezvousMode::kRead : RendezvousMode::kTagged;
    } else if (key == "pid") {
      ok = absl::SimpleAtoi(value, &record.pid);
    } else if (key == "host") {
      record.host = std::string(value);
    } else if (key == "doorbell") {
      record.doorbell = absl::HexStringToBytes(value);
      ok = value.size() % 2 == 0 &&
           record.doorbell.size() <= sizeof(sockaddr_un::sun_path);
      --fields;  // optional
    } else if (key == "name") {
      record.name = absl::HexStringToBytes(value);
      ok = value.size() % 2 == 0;
      --fields;  // optional
    } else {
      continue;  // a later version's field
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad field '", key, "' in a libfabric address record"));
    }
    ++fields;
  }
  if (fields < 7) {
    return absl::InvalidArgumentError("incomplete libfabric address record");
  }
  return record;
}

// The boot id and the pid and network namespaces: peers with the same
// identity can see each other's pids and abstract Unix sockets.
std::string host_identity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string identity;
  std::getline(boot, identity);
  if (identity.empty()) return "";
  for (const char* ns : {"/proc/self/ns/pid", "/proc/self/ns/net"}) {
    char link[128];
    const ssize_t length = ::readlink(ns, link, sizeof(link));
    if (length <= 0) return "";
    absl::StrAppend(&identity, "/", absl::string_view(link, length));
  }
  return identity;
}

// ----------------------------------------------------------- operations

struct Op;

// What libfabric gets as an operation's context: its scratch space, then
// the operation it belongs to.
struct OpContext {
  fi_context2 scratch;
  Op* op;
};

enum class OpKind {
  kEagerReceive,  // a pre-posted buffer of the pool
  kEagerSend,     // a frame from a send buffer
  kRead,          // a chunk pulled with fi_read
  kBulkReceive,   // a chunk pulled by a tagged receive
  kBulkSend,      // a chunk sent on a peer's clear-to-send
};

struct Incoming;
struct Transfer;

struct Op {
  Op() { context.op = this; }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  OpContext context;
  OpKind kind = OpKind::kEagerSend;
  int rank = -1;
  // The local buffer: a pool slot, a send buffer, a chunk's place.
  char* buffer = nullptr;
  size_t length = 0;
  void* desc = nullptr;
  // Eager buffers: the slot's index.
  size_t slot = 0;
  uint64_t remote_address = 0;
  uint64_t key = 0;
  uint64_t tag = 0;
  // Pulls: the message they fill; bulk sends: the transfer they read.
  std::shared_ptr<Incoming> incoming;
  std::shared_ptr<Transfer> transfer;
};

// A message the sender lends by rendezvous: kept, with its registrations,
// until the receiver releases it.
struct Transfer {
  uint64_t id = 0;
  int rank = -1;
  // Declared before the message, so destroyed after it: released, a
  // storage's registration sees whether anyone else still holds it.
  std::vector<MrCache::Handle> storage_regions;
  Message message;
  std::string body;  // the encoded body, when it is remote
  std::unique_ptr<MemoryRegion> body_region;
  std::unique_ptr<MemoryRegion> payload_region;
  // Per segment, where its bytes are and their descriptor (remote ones).
  std::vector<const char*> segment_data;
  std::vector<void*> segment_desc;
  // Tagged mode: the chunks the receiver asks for, and their tags' base.
  std::vector<Chunk> chunks;
  uint64_t sequence_base = 0;
};

// A message being received: its remote parts being pulled.
struct Incoming {
  int rank = -1;
  FrameKind kind = FrameKind::kRequest;
  MessageHead head;
  uint64_t transfer = 0;
  uint64_t sequence_base = 0;
  uint64_t chunk_size = 0;
  // Pulling the remote body first, then the segments it lists.
  bool pulling_body = false;
  std::string body;
  std::unique_ptr<MemoryRegion> body_region;
  std::vector<SegmentDesc> segments;
  std::vector<std::unique_ptr<MemoryRegion>> segment_regions;
  Message message;
  std::vector<Chunk> chunks;
  size_t next_chunk = 0;  // the next to issue
  size_t announced = 0;   // tagged mode: chunks the sender was told to send
  size_t completed = 0;
  int outstanding = 0;
  absl::Status error;
  // The peer was lost: nothing more is done for this message.
  bool abandoned = false;
};

// A frame waiting for a credit, a send buffer or room on the endpoint.
struct OutFrame {
  FrameHeader header;  // credits and the slot return are set when it goes
  std::string tail;    // what follows the header
};

// What one agent knows of one worker of its group (itself included).
struct Peer {
  int rank = -1;
  std::string name;
  fi_addr_t address = FI_ADDR_NOTAVAIL;
  // From its record.
  uint64_t buffer_size = 0;
  uint32_t granted = 0;  // credits it grants us
  RendezvousMode mode = RendezvousMode::kRead;
  int64_t pid = 0;
  bool same_host = false;
  // Its doorbell (same host only; length 0: none).
  sockaddr_un doorbell{};
  socklen_t doorbell_length = 0;

  // Sending to it.
  uint32_t credits = 0;
  bool control_slot_free = true;
  std::deque<OutFrame> queue;
  bool queued_listed = false;
  // Receiving from it: credits and the control slot we owe it.
  uint32_t owed = 0;
  bool control_slot_owed = false;
  bool credit_listed = false;

  // Our requests awaiting its response; our transfers it has not
  // released; its messages we are pulling.
  absl::flat_hash_set<int64_t> requests;
  absl::flat_hash_set<uint64_t> transfers;
  absl::flat_hash_set<std::shared_ptr<Incoming>> incoming;

  // Liveness.
  absl::Time last_heard = absl::InfinitePast();
  absl::Time expecting_since = absl::InfiniteFuture();
  absl::Time keepalive_sent = absl::InfinitePast();
  // The first keepalive of the current silence that our own progress
  // thread then had time to hear an answer to (see housekeeping()).
  absl::Time asked_at = absl::InfinitePast();
  bool ack_queued = false;
  // Frames went either way: it is told goodbye at shutdown.
  bool talked = false;
  // Why it is lost, while it is; `gone` once it said goodbye.
  std::optional<absl::Status> lost;
  bool gone = false;
  // Bumped when it is lost: requests sent later are on a new connection.
  uint32_t epoch = 0;
  // Dynamic groups: it left (Agent::remove_peer); its address is out of
  // the address vector and its slot waits for a worker joining with its
  // rank.
  bool left = false;
  // Dynamic groups: it is leaving (Agent::remove_peer): no new sends go to
  // it, what it still sends (its goodbye, answers) is taken, and it is
  // dropped on its goodbye or when a worker joins with its rank.
  bool leaving = false;
  // Its endpoint's name, as inserted.
  std::string raw_address;

  // Authentication (AgentSetup::auth; internal/frame.h has the handshake),
  // one per direction. Our requests to it wait in auth_waiting until it
  // has proved itself and accepted our proof.
  enum class ClientAuth { kNone, kHelloSent, kProofSent, kReady };
  ClientAuth client_auth = ClientAuth::kNone;
  std::string client_challenge;  // ours, in our kHello
  std::deque<std::pair<int64_t, Message>> auth_waiting;
  // Its requests to us are accepted once it is kAuthenticated.
  enum class ServerAuth { kNone, kAwaitProof, kAuthenticated };
  ServerAuth server_auth = ServerAuth::kNone;
  std::string server_challenge;  // ours, in our kServerProof
  std::string hello_challenge;   // its, from its kHello
};

// A request that arrived before start().
struct Deferred {
  int rank = -1;
  Message request;
};

// A range of chunks a peer asked for (tagged mode).
struct SendRange {
  std::shared_ptr<Transfer> transfer;
  size_t next = 0;
  size_t end = 0;
};

// The libfabric objects and buffers of an agent that has shut down.
struct ClosedEndpoint {
  // Closes the endpoint first, then what it may have used.
  void close() {
    if (fabric != nullptr) fabric->close_endpoint();
    receive_ops.clear();
    send_ops.clear();
    receive_regions.clear();
    send_region.reset();
    receive_slabs.clear();
    send_slab.clear();
    fabric.reset();
  }

  std::vector<std::unique_ptr<Op>> receive_ops;
  std::vector<std::unique_ptr<Op>> send_ops;
  std::vector<std::unique_ptr<MemoryRegion>> receive_regions;
  std::unique_ptr<MemoryRegion> send_region;
  std::vector<std::vector<char>> receive_slabs;
  std::vector<char> send_slab;
  std::unique_ptr<Fabric> fabric;
};

// The shm endpoints of this process. libfabric 1.17's shm provider lets
// endpoints of one process use each other's memory region directly, and
// closing an endpoint unmaps its region: a send to it (or a completion
// written back to it) from another endpoint of the process then crashes.
// So an shm endpoint that shuts down while another one of the process is
// open stays open, idle, and closes with the last one: what is sent to it
// meanwhile is never read, as if it had gone. Processes with one worker,
// the usual case, are not affected. Thread-safe.
class SharedEndpoints {
 public:
  static SharedEndpoints& get() {
    static auto* endpoints = new SharedEndpoints();  // never destroyed
    return *endpoints;
  }

  void opened() {
    absl::MutexLock lock(&mu_);
    ++open_;
  }

  // Whether an shm endpoint other than the caller's is open.
  bool others_open() {
    absl::MutexLock lock(&mu_);
    return open_ > 1;
  }

  // The caller's endpoint (counted by opened()) shuts down: parked while
  // others are open, else closed with every parked one.
  void close(std::unique_ptr<ClosedEndpoint> endpoint) {
    std::vector<std::unique_ptr<ClosedEndpoint>> closing;
    {
      absl::MutexLock lock(&mu_);
      if (--open_ > 0) {
        parked_.push_back(std::move(endpoint));
        return;
      }
      closing.swap(parked_);
    }
    closing.push_back(std::move(endpoint));
    for (auto& closed : closing) closed->close();
  }

 private:
  absl::Mutex mu_;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<ClosedEndpoint>> parked_ ABSL_GUARDED_BY(mu_);
};

absl::Status status_from_code(int32_t code, std::string text) {
  if (code <= 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<int32_t>(absl::StatusCode::kUnknown);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), text);
}

// ------------------------------------------------------------------- state

// Everything an agent has. Callbacks of futures hold it weakly; its
// progress thread uses it until shutdown() has joined that thread.
class State : public std::enable_shared_from_this<State> {
 public:
  State(AgentSetup setup, Settings settings)
      : self_(std::move(setup.self)),
        workers_(std::move(setup.workers)),
        store_(std::move(setup.store)),
        settings_(std::move(settings)),
        limits_(setup.limits),
        auth_(std::move(setup.auth)),
        peer_timeout_(setup.peer_timeout),
        dynamic_(setup.dynamic),
        joiner_(store_, kBackendName, self_.id,
                static_cast<int>(workers_.size())),
        timers_(std::make_unique<TimerQueue>(/*owner=*/this)),
        pending_(timers_.get()) {
    absl::MutexLock lock(&names_mu_);
    for (const WorkerInfo& worker : workers_) {
      rank_by_name_[worker.name] = worker.id;
    }
  }

  ~State() {
    // WARNING: this may run on any thread that held the last reference;
    // shutdown() has joined the progress thread and closed the fabric.
    if (event_fd_ >= 0) ::close(event_fd_);
    if (doorbell_fd_ >= 0) ::close(doorbell_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  absl::Status init();
  absl::Status start(RequestHandler handler);
  Future<Message> send(const WorkerInfo& to, Message request,
                       absl::Duration timeout);
  absl::Status join(absl::Duration timeout);
  void shutdown();
  // Dynamic groups: reads the joiner's record from the store and has the
  // progress thread insert it (install_peer()).
  absl::Status add_peer(const WorkerInfo& worker);
  // Dynamic groups: sends to it fail at once; the progress thread takes
  // its address out of the address vector and drops its state.
  void remove_peer(const WorkerInfo& worker);
  absl::StatusOr<LibfabricStats> stats();

  const WorkerInfo& self() const { return self_; }
  const std::vector<WorkerInfo>& workers() const { return workers_; }

 private:
  // ---- any thread
  // Runs `command` on the progress thread; false once shut down.
  bool post(std::function<void()> command) ABSL_LOCKS_EXCLUDED(mu_);
  void wake();
  bool has_commands() ABSL_LOCKS_EXCLUDED(mu_);
  void finish_handling() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- creation (the creating thread, before the progress thread runs)
  absl::Status open_fabric();
  absl::Status exchange_records();
  absl::Status set_up_wakeups();
  // The eager receive pool holds buffers for `peers` workers (grows only).
  absl::Status grow_pool(size_t peers);
  // Checks a peer's record against ours (provider) and, unless `worker`
  // has no name (yet), its name.
  absl::StatusOr<Record> peer_record(const WorkerInfo& worker,
                                     absl::string_view published) const;
  // Makes `worker` a known peer with `record` (a fresh slot: its address
  // inserted, credits and buffers for it). On the progress thread, or in
  // init() before it runs.
  absl::Status install_peer(const WorkerInfo& worker, const Record& record);
  // Dynamic groups, the progress thread: a frame from rank `rank`, unknown
  // here, is the first word of a joiner the Worker has not been told of
  // yet: its record names it. False if there is none.
  bool adopt_unknown(int rank);
  // Dynamic groups: forgets a peer that left (fails what waits on it with
  // `why`, takes its address out of the address vector).
  void drop_peer(int rank, const absl::Status& why);

  // ---- the progress thread
  void run();
  bool run_commands(bool* stop) ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps until woken or until a timeout; true if the timeout ran out.
  bool idle(absl::Time next_tick, absl::Duration* poll_sleep,
            absl::Duration* nap);
  // Something of ours waits on a peer or on the provider.
  bool waiting();
  bool poll_completions();
  void on_completion(Op* op, size_t length);
  void on_error(const fi_cq_err_entry& error);
  void housekeeping(absl::Time now);
  void teardown();

  // Operations.
  int issue(Op* op);
  void post_receive(Op* op);
  bool pump();
  bool have_tx_room() const { return tx_inflight_ < tx_limit_; }

  // Frames.
  void enqueue(int rank, OutFrame frame);
  void send_control(int rank, FrameKind kind, uint64_t arg0 = 0,
                    uint64_t arg1 = 0, uint64_t arg2 = 0);
  enum class Sent { kSent, kWait, kFailed };
  Sent transmit(Peer& peer, OutFrame& frame, bool control);
  bool flush(Peer& peer);
  bool send_due_credits();
  void on_frame(Op* op, size_t length);

  // Authentication.
  void send_auth(int rank, AuthFrame frame);
  void on_auth_frame(Peer& peer, absl::string_view tail);
  // Whether a frame of `kind` from `peer` may be acted on; if not, it is
  // dropped with a log line (and a request is refused).
  bool admitted(Peer& peer, const FrameHeader& header);
  // As the server: tells the peer why, forgets its handshake.
  void refuse(Peer& peer, const std::string& why);
  // As the client: fails our requests to the peer with `status`
  // (UNAUTHENTICATED); the next request starts a new handshake.
  void fail_client_auth(Peer& peer, const absl::Status& status);

  // Messages.
  void start_request(int rank, int64_t id, Message request);
  void respond(int rank, int64_t id, const absl::StatusOr<Message>& result);
  void send_message(int rank, FrameKind kind, int64_t id, int32_t code,
                    Message message);
  void on_message_frame(Peer& peer, const FrameHeader& header,
                        absl::string_view rest);
  absl::Status set_up_segments(Incoming& in, absl::string_view body);
  void pump_pull(const std::shared_ptr<Incoming>& in);
  void on_pulled(Op* op, const absl::Status& status);
  void finish_incoming(const std::shared_ptr<Incoming>& in);
  void deliver(Incoming& in);
  void on_clear_to_send(Peer& peer, uint64_t transfer, uint64_t first,
                        uint64_t count);
  bool pump_sends();
  void handle_request(int rank, Message request) ABSL_LOCKS_EXCLUDED(mu_);
  void serve_deferred() ABSL_LOCKS_EXCLUDED(mu_);
  void run_handler(const RequestHandler& handler, int rank, Message request);

  // Peers.
  void heard_from(Peer& peer);
  void fail_peer(int rank, const absl::Status& status);
  PendingRequests::Connection connection_of(const Peer& peer) const {
    return (static_cast<uint64_t>(peer.epoch) << 32) |
           static_cast<uint64_t>(peer.rank + 1);
  }
  std::string describe(int rank) const {
    if (rank >= 0 && static_cast<size_t>(rank) < peers_.size() &&
        !peers_[rank].name.empty()) {
      return absl::StrCat("worker '", peers_[rank].name, "' (rank ", rank,
                          ")");
    }
    return absl::StrCat("rank ", rank);
  }
  static bool absent(const Peer& peer) { return peer.rank < 0 || peer.left; }
  uint32_t in_flight(const Peer& peer) const {
    return peer.granted - peer.credits + (peer.control_slot_free ? 0 : 1);
  }

  const WorkerInfo self_;
  const std::vector<WorkerInfo> workers_;
  const std::shared_ptr<c10d::Store> store_;
  const Settings settings_;
  const MessageLimits limits_;
  const std::optional<auth::Authenticator> auth_;
  // The peers sends may go to, by name (dynamic groups change it).
  absl::Mutex names_mu_;
  absl::flat_hash_map<std::string, int> rank_by_name_ ABSL_GUARDED_BY(names_mu_);
  // Set at init.
  std::string host_;
  // Bound of a liveness probe in join() (AgentSetup::peer_timeout).
  const absl::Duration peer_timeout_;
  const bool dynamic_;
  join::StoreJoin joiner_;

  common::ShutdownSequence shutdown_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const RequestHandler> handler_ ABSL_GUARDED_BY(mu_);
  // Requests received and not yet answered (for join).
  int64_t incoming_active_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread progress_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<TimerQueue> timers_ ABSL_GUARDED_BY(mu_);
  PendingRequests pending_;

  // Wake-ups of the progress thread (set by init(), then const).
  int event_fd_ = -1;
  int epoll_fd_ = -1;
  // Polled providers: a Unix datagram socket that same-host peers write a
  // byte to after each frame they send us, so that an idle progress thread
  // can sleep instead of polling (its name is published in our record).
  int doorbell_fd_ = -1;
  std::string doorbell_name_;
  // Every peer has a doorbell we can ring, so none needs us to poll.
  bool all_peers_ring_ = true;
  std::atomic<bool> sleeping_{false};

  // ---- the progress thread's own (and init()'s, before it starts)
  std::unique_ptr<Fabric> fabric_;
  std::vector<Peer> peers_;
  RendezvousMode mode_ = RendezvousMode::kRead;  // how we pull
  uint64_t threshold_ = 0;                       // the rendezvous threshold
  uint64_t buffer_size_ = 0;                     // our eager buffers
  uint32_t credits_ = 0;                         // we grant each peer
  uint64_t send_buffer_size_ = 0;
  uint64_t chunk_size_ = 0;
  absl::Duration spin_;
  absl::Duration keepalive_interval_;
  absl::Duration tick_;
  // The eager receive buffers: one slab per growth of the pool (a dynamic
  // group's pool grows as workers join; it never shrinks: a leaver's
  // buffers wait for the next joiner).
  std::vector<std::vector<char>> receive_slabs_;
  std::vector<char> send_slab_;
  std::vector<std::unique_ptr<MemoryRegion>> receive_regions_;
  // How many peers (self included) the pool holds buffers for, and how
  // many are known now.
  size_t pool_peers_ = 0;
  size_t known_peers_ = 0;
  std::unique_ptr<MemoryRegion> send_region_;
  std::vector<std::unique_ptr<Op>> receive_ops_;
  std::vector<std::unique_ptr<Op>> send_ops_;
  std::vector<size_t> free_send_buffers_;
  std::unique_ptr<MrCache> mr_cache_;
  // Strangers on the provider's TCP listener (tcp providers only).
  std::unique_ptr<ListenerGuard> listener_guard_;
  absl::Time last_guard_sweep_ = absl::InfinitePast();
  size_t tx_limit_ = 0;
  size_t rx_limit_ = 0;
  size_t rx_reserve_ = 0;
  size_t tx_inflight_ = 0;
  size_t rx_inflight_ = 0;
  // Operations we allocated that libfabric holds.
  absl::flat_hash_set<Op*> inflight_;
  // Eager buffers refused with FI_EAGAIN, to post again in order.
  std::deque<Op*> retry_;
  // Something was refused with FI_EAGAIN since the last sleep.
  bool refused_ = false;
  std::deque<std::shared_ptr<Incoming>> pulls_waiting_;
  std::deque<SendRange> sends_waiting_;
  std::vector<int> queued_ranks_;
  // Requests that arrived before start().
  std::vector<Deferred> deferred_;
  std::vector<int> credit_due_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> transfers_;
  uint64_t next_transfer_ = 1;
  uint64_t next_sequence_ = 0;
  absl::Time last_prune_ = absl::InfinitePast();
  absl::Time last_housekeeping_ = absl::InfinitePast();
  LibfabricStats stats_;
};

// --------------------------------------------------------------- creation

absl::Status State::open_fabric() {
  const size_t world = workers_.size();
  if (world > frame::kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("the libfabric backend supports groups of up to ",
                     frame::kMaxRanks, " workers, not ", world));
  }
  FabricOptions options;
  options.provider = settings_.provider;
  options.address = settings_.address;
  options.address_required = settings_.address_given;
  options.want_rma = settings_.rendezvous != RendezvousMode::kTagged;
  absl::StatusOr<std::unique_ptr<Fabric>> opened = Fabric::open(options, world);
  if (!opened.ok()) return opened.status();
  fabric_ = *std::move(opened);
  if (fabric_->provider_name() == "shm") SharedEndpoints::get().opened();
  if (settings_.rendezvous == RendezvousMode::kRead && !fabric_->has_rma()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "libfabric provider '", fabric_->provider_name(),
        "' has no FI_RMA here: libfabric.rendezvous=read is not possible; "
        "use 'tagged' or 'auto'"));
  }
  mode_ = settings_.rendezvous == RendezvousMode::kTagged || !fabric_->has_rma()
              ? RendezvousMode::kTagged
              : RendezvousMode::kRead;
  chunk_size_ = std::min<uint64_t>(kMaxChunk, fabric_->max_message_size());
  // A provider may move a message beyond its inject size in several steps
  // of the receiver's progress (shm: segments, or a cross-memory copy that
  // the receiver acknowledges), each waiting on a receiver that sleeps
  // between frames. Where the inject size makes a useful eager frame, the
  // default threshold keeps frames within it.
  threshold_ = settings_.rendezvous_threshold;
  const size_t inject = fabric_->inject_size();
  if (!settings_.threshold_given && inject >= kUsefulInjectSize &&
      inject < threshold_ + kBufferSlack) {
    threshold_ = inject - kBufferSlack;
  }
  buffer_size_ = threshold_ + kBufferSlack;
  if (buffer_size_ > fabric_->max_message_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "setting libfabric.rendezvous_threshold: eager buffers of ",
        buffer_size_, " bytes exceed provider '", fabric_->provider_name(),
        "''s largest message (", fabric_->max_message_size(), " bytes)"));
  }

  // The receive queue holds world x (credits + 1) eager buffers and room
  // for tagged bulk receives. A dynamic group plans for at least
  // kDynamicPlannedPeers workers; it grows the pool as more join, as far as
  // the receive queue allows.
  const size_t rx = fabric_->rx_size();
  const size_t reserve = std::min(kBulkReceiveReserve, rx / 4);
  const size_t planned =
      dynamic_ ? std::max(world, kDynamicPlannedPeers) : world;
  const size_t per_peer = (rx - reserve) / planned;
  if (per_peer < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "libfabric provider '", fabric_->provider_name(),
        "' has a receive queue of ", rx, " entries: too few for ", world,
        " workers (each needs at least 2)"));
  }
  credits_ = static_cast<uint32_t>(
      std::min<size_t>(settings_.credits, per_peer - 1));
  tx_limit_ = fabric_->tx_size();
  rx_limit_ = rx;
  rx_reserve_ = reserve;

  spin_ = settings_.spin;
  keepalive_interval_ =
      std::max(absl::Milliseconds(20), settings_.peer_timeout / 5);
  tick_ = std::min(kMaxTick, keepalive_interval_ / 2);

  if (absl::Status grown = grow_pool(world); !grown.ok()) return grown;
  MrCache::Limits limits;
  limits.max_entries = settings_.mr_cache_entries;
  limits.max_bytes = settings_.mr_cache_bytes;
  mr_cache_ = std::make_unique<MrCache>(fabric_.get(), limits);

  stats_.provider = fabric_->provider_name();
  stats_.rendezvous = rendezvous_mode_name(mode_);
  stats_.sleeps_on_fd = fabric_->wait_fd() >= 0;
  stats_.credits = credits_;
  stats_.eager_buffer_bytes = buffer_size_;
  stats_.rendezvous_threshold = threshold_;
  return absl::OkStatus();
}

absl::Status State::grow_pool(size_t peers) {
  if (peers <= pool_peers_) return absl::OkStatus();
  const size_t slots = (peers - pool_peers_) * (credits_ + 1);
  if (rx_limit_ < slots + rx_reserve_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "libfabric provider '", fabric_->provider_name(),
        "' has a receive queue too small for eager buffers of ", peers,
        " workers"));
  }
  std::vector<char> slab;
  try {
    slab.resize(slots * buffer_size_);
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", slots, " libfabric receive buffers of ",
        buffer_size_, " bytes: ", e.what()));
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
      fabric_->register_memory(slab.data(), slab.size(), FI_RECV);
  if (!region.ok()) return region.status();
  receive_slabs_.push_back(std::move(slab));
  receive_regions_.push_back(*std::move(region));
  rx_limit_ -= slots;
  pool_peers_ = peers;
  char* base = receive_slabs_.back().data();
  void* desc = receive_regions_.back()->desc();
  for (size_t slot = 0; slot < slots; ++slot) {
    auto op = std::make_unique<Op>();
    op->kind = OpKind::kEagerReceive;
    op->slot = receive_ops_.size();
    op->buffer = base + slot * buffer_size_;
    op->length = buffer_size_;
    op->desc = desc;
    op->tag = frame::kEagerTag;
    Op* raw = op.get();
    receive_ops_.push_back(std::move(op));
    const int rc = issue(raw);
    if (rc == -FI_EAGAIN) {
      retry_.push_back(raw);
    } else if (rc != 0) {
      return absl::UnavailableError(absl::StrCat(
          "libfabric fi_trecv of eager buffer ", slot, " of ", slots,
          " failed: ", libfabric::internal::fi_error_text(-rc)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Record> State::peer_record(const WorkerInfo& worker,
                                          absl::string_view published) const {
  absl::StatusOr<Record> record = decode_record(published);
  if (!record.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "libfabric agent of worker '", self_.name, "': worker '", worker.name,
        "' (rank ", worker.id, "): ", record.status().message()));
  }
  if (record->provider != fabric_->provider_name()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "libfabric agent of worker '", self_.name, "' uses provider '",
        fabric_->provider_name(), "' but worker '", worker.name, "' (rank ",
        worker.id, ") uses '", record->provider,
        "': every worker of a group must use the same"));
  }
  if (!worker.name.empty() && !record->name.empty() &&
      record->name != worker.name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "libfabric agent of worker '", self_.name, "': the address of rank ",
        worker.id, " is worker '", record->name, "''s, not '", worker.name,
        "''s"));
  }
  return record;
}

absl::Status State::install_peer(const WorkerInfo& worker,
                                 const Record& record) {
  if (worker.id < 0 || static_cast<uint32_t>(worker.id) >= frame::kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("the libfabric backend takes ranks below ",
                     frame::kMaxRanks, ", not ", worker.id));
  }
  const size_t rank = static_cast<size_t>(worker.id);
  if (rank >= peers_.size()) peers_.resize(rank + 1);
  absl::StatusOr<std::vector<fi_addr_t>> address =
      fabric_->insert({record.address});
  if (!address.ok()) return address.status();
  Peer peer;
  peer.rank = worker.id;
  peer.name = worker.name;
  peer.address = (*address)[0];
  peer.raw_address = record.address;
  // Frames to it are built in our send buffers (sized at init).
  peer.buffer_size = send_buffer_size_ == 0
                         ? record.buffer_size
                         : std::min(record.buffer_size, send_buffer_size_);
  peer.granted = record.credits;
  peer.credits = record.credits;
  peer.mode = record.mode;
  peer.pid = record.pid;
  peer.same_host = !host_.empty() && record.host == host_;
  // A worker that joins with a leaver's rank is on a new connection.
  peer.epoch = peers_[rank].epoch + 1;
  if (peer.same_host && !record.doorbell.empty()) {
    peer.doorbell.sun_family = AF_UNIX;
    std::memcpy(peer.doorbell.sun_path, record.doorbell.data(),
                record.doorbell.size());
    peer.doorbell_length = static_cast<socklen_t>(
        offsetof(sockaddr_un, sun_path) + record.doorbell.size());
  } else if (peer.rank != self_.id) {
    all_peers_ring_ = false;
  }
  peers_[rank] = std::move(peer);
  ++known_peers_;
  {
    absl::MutexLock lock(&names_mu_);
    rank_by_name_[worker.name] = worker.id;
  }
  // Credits granted to it are backed by buffers.
  return grow_pool(known_peers_);
}

void State::drop_peer(int rank, const absl::Status& why) {
  Peer& peer = peers_[rank];
  if (absent(peer)) return;
  fail_peer(rank, why);
  for (const std::shared_ptr<Incoming>& in : peer.incoming) {
    in->abandoned = true;
  }
  peer.incoming.clear();
  if (absl::Status removed = fabric_->remove(peer.address); !removed.ok()) {
    LOG(WARNING) << "libfabric agent of worker '" << self_.name
                 << "' cannot forget the address of " << describe(rank)
                 << ": " << removed.message();
  }
  VLOG(1) << "libfabric agent of worker '" << self_.name << "' drops "
          << describe(rank) << ": " << why.message();
  peer.address = FI_ADDR_NOTAVAIL;
  peer.left = true;
  peer.talked = false;
  --known_peers_;
}

bool State::adopt_unknown(int rank) {
  const std::string who =
      absl::StrCat("libfabric agent of worker '", self_.name, "'");
  const WorkerInfo unknown{absl::StrCat("rank ", rank), rank};
  absl::StatusOr<std::string> text =
      common::lookup_address(*store_, kAddressKeyPrefix, unknown, who);
  // Its name is what its record says.
  absl::StatusOr<Record> record =
      text.ok() ? peer_record(WorkerInfo{"", rank}, *text) : text.status();
  if (record.ok() && record->name.empty()) {
    record = absl::InvalidArgumentError("its address record has no name");
  }
  if (static_cast<size_t>(rank) < peers_.size() && !absent(peers_[rank])) {
    // A leaving worker's rank: is the frame the leaver's or a joiner's?
    if (!record.ok() || peers_[rank].raw_address == record->address) {
      return true;
    }
    drop_peer(rank, absl::UnavailableError(absl::StrCat(
                        describe(rank), " has left: worker '", record->name,
                        "' joins with its rank")));
  }
  if (record.ok()) {
    absl::MutexLock lock(&names_mu_);
    auto taken = rank_by_name_.find(record->name);
    if (taken != rank_by_name_.end() && taken->second != rank) {
      record = absl::AlreadyExistsError(
          absl::StrCat("worker '", record->name, "' is rank ", taken->second));
    }
  }
  absl::Status installed =
      record.ok() ? install_peer(WorkerInfo{record->name, rank}, *record)
                  : record.status();
  if (!installed.ok()) {
    LOG(WARNING) << who << " drops a frame from unknown rank " << rank << ": "
                 << installed.message();
    return false;
  }
  LOG(INFO) << who << ": " << describe(rank)
            << " makes contact before it has been announced (it is joining)";
  return true;
}

absl::Status State::add_peer(const WorkerInfo& worker) {
  if (!dynamic_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "libfabric agent of worker '", self_.name,
        "' is in a static group: worker '", worker.name, "' cannot join it"));
  }
  const std::string who =
      absl::StrCat("libfabric agent of worker '", self_.name, "'");
  absl::StatusOr<std::string> text =
      common::lookup_address(*store_, kAddressKeyPrefix, worker, who);
  if (!text.ok()) return text.status();
  auto result = std::make_shared<absl::Status>();
  auto done = std::make_shared<absl::Notification>();
  if (!post([this, worker, who, text = *std::move(text), result, done] {
        *result = [&]() -> absl::Status {
          absl::StatusOr<Record> record = peer_record(worker, text);
          if (!record.ok()) return record.status();
          {
            absl::MutexLock lock(&names_mu_);
            auto taken = rank_by_name_.find(worker.name);
            if (taken != rank_by_name_.end() && taken->second != worker.id) {
              return absl::AlreadyExistsError(absl::StrCat(
                  who, ": worker '", worker.name, "' is rank ", taken->second,
                  ", not ", worker.id));
            }
          }
          const size_t rank = static_cast<size_t>(worker.id);
          if (worker.id >= 0 && rank < peers_.size() && !absent(peers_[rank])) {
            Peer& known = peers_[rank];
            if (known.name != worker.name && !known.leaving) {
              return absl::AlreadyExistsError(
                  absl::StrCat(who, ": rank ", worker.id, " is worker '",
                               known.name, "', not '", worker.name, "'"));
            }
            // Its first frame came before MEMBER_JOIN: known already.
            if (known.name == worker.name &&
                known.raw_address == record->address) {
              known.leaving = false;
              absl::MutexLock lock(&names_mu_);
              rank_by_name_[worker.name] = worker.id;
              return absl::OkStatus();
            }
            drop_peer(worker.id, absl::UnavailableError(absl::StrCat(
                                     describe(worker.id), " has left: worker '",
                                     worker.name, "' joins with its rank")));
          }
          return install_peer(worker, *record);
        }();
        done->Notify();
      })) {
    return absl::CancelledError(
        absl::StrCat("worker '", self_.name, "' has shut down"));
  }
  if (!done->WaitForNotificationWithTimeout(kStatsBound)) {
    return absl::DeadlineExceededError(absl::StrCat(
        who, " did not add worker '", worker.name, "' within ",
        absl::FormatDuration(kStatsBound)));
  }
  return *result;
}

void State::remove_peer(const WorkerInfo& worker) {
  if (!dynamic_) return;
  {
    absl::MutexLock lock(&names_mu_);
    auto known = rank_by_name_.find(worker.name);
    if (known == rank_by_name_.end() || known->second != worker.id) return;
    rank_by_name_.erase(known);
  }
  post([this, worker] {
    const size_t rank = static_cast<size_t>(worker.id);
    if (rank >= peers_.size() || absent(peers_[rank]) ||
        peers_[rank].name != worker.name) {
      return;
    }
    // Dropped on its goodbye, or when a worker joins with its rank: until
    // then it may still answer, and is answered.
    peers_[rank].leaving = true;
  });
}

absl::Status State::exchange_records() {
  absl::StatusOr<std::string> name = fabric_->name();
  if (!name.ok()) return name.status();
  if (absl::StartsWith(fabric_->provider_name(), "tcp")) {
    listener_guard_ = ListenerGuard::for_name(*name, settings_.accept_timeout);
  }
  Record mine;
  mine.provider = fabric_->provider_name();
  mine.address = *std::move(name);
  mine.buffer_size = buffer_size_;
  mine.credits = credits_;
  mine.mode = mode_;
  mine.pid = ::getpid();
  mine.host = host_identity();
  mine.doorbell = doorbell_name_;
  mine.name = self_.name;
  host_ = mine.host;
  const std::string who =
      absl::StrCat("libfabric agent of worker '", self_.name, "'");
  // Every worker's record, in rank order.
  std::vector<std::pair<WorkerInfo, Record>> records;
  if (dynamic_) {
    // The members present now; joiners come through add_peer() (or their
    // first frame).
    absl::Status published = common::publish_address(
        *store_, kAddressKeyPrefix, self_.id, encode_record(mine), who);
    if (!published.ok()) return published;
    for (const WorkerInfo& worker : workers_) {
      if (worker.id == self_.id) {
        records.emplace_back(worker, mine);
        continue;
      }
      absl::StatusOr<std::string> text =
          common::lookup_address(*store_, kAddressKeyPrefix, worker, who);
      if (!text.ok()) return text.status();
      absl::StatusOr<Record> record = peer_record(worker, *text);
      if (!record.ok()) return record.status();
      records.emplace_back(worker, *std::move(record));
    }
  } else {
    absl::StatusOr<std::vector<std::string>> published =
        common::exchange_addresses(*store_, kAddressKeyPrefix, self_.id,
                                   static_cast<int>(workers_.size()),
                                   encode_record(mine), settings_.init_timeout,
                                   who);
    if (!published.ok()) return published.status();
    for (size_t rank = 0; rank < published->size(); ++rank) {
      absl::StatusOr<Record> record =
          peer_record(workers_[rank], (*published)[rank]);
      if (!record.ok()) return record.status();
      records.emplace_back(workers_[rank], *std::move(record));
    }
  }
  send_buffer_size_ = buffer_size_;
  for (const auto& [worker, record] : records) {
    send_buffer_size_ = std::max(send_buffer_size_, record.buffer_size);
  }
  for (const auto& [worker, record] : records) {
    if (absl::Status installed = install_peer(worker, record);
        !installed.ok()) {
      return installed;
    }
  }

  // Send buffers, now that the peers' buffer sizes are known.
  try {
    send_slab_.resize(kSendBuffers * send_buffer_size_);
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate libfabric send buffers: ", e.what()));
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
      fabric_->register_memory(send_slab_.data(), send_slab_.size(), FI_SEND);
  if (!region.ok()) return region.status();
  send_region_ = *std::move(region);
  for (size_t i = 0; i < kSendBuffers; ++i) {
    auto op = std::make_unique<Op>();
    op->kind = OpKind::kEagerSend;
    op->slot = i;
    op->buffer = send_slab_.data() + i * send_buffer_size_;
    op->desc = send_region_->desc();
    op->tag = frame::kEagerTag;
    send_ops_.push_back(std::move(op));
    free_send_buffers_.push_back(kSendBuffers - 1 - i);
  }
  return absl::OkStatus();
}

absl::Status State::set_up_wakeups() {
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("eventfd failed: ", std::strerror(errno)));
  }
  if (fabric_->wait_fd() < 0) {
    doorbell_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    // Autobind: the kernel picks a unique abstract name.
    socklen_t length = sizeof(sa_family_t);
    if (doorbell_fd_ < 0 ||
        ::bind(doorbell_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::getsockname(doorbell_fd_, reinterpret_cast<sockaddr*>(&address),
                      &(length = sizeof(address))) != 0) {
      // Peers will not ring: the progress thread polls.
      LOG(WARNING) << "libfabric agent of worker '" << self_.name
                   << "' has no doorbell: " << std::strerror(errno);
      if (doorbell_fd_ >= 0) ::close(doorbell_fd_);
      doorbell_fd_ = -1;
      return absl::OkStatus();
    }
    doorbell_name_.assign(address.sun_path,
                          length - offsetof(sockaddr_un, sun_path));
    return absl::OkStatus();
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("epoll_create1 failed: ", std::strerror(errno)));
  }
  for (int fd : {event_fd_, fabric_->wait_fd()}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
      return absl::InternalError(
          absl::StrCat("epoll_ctl failed: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status State::init() {
  absl::Status status = open_fabric();
  if (status.ok()) status = set_up_wakeups();
  if (status.ok()) status = exchange_records();
  if (!status.ok()) {
    teardown();  // this thread still owns the fabric
    return status;
  }
  absl::MutexLock lock(&mu_);
  // The thread gets what init() built: starting it orders those writes
  // before its reads.
  progress_ = std::thread([this] { run(); });
  return absl::OkStatus();
}

absl::Status State::start(RequestHandler handler) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return absl::CancelledError(
          absl::StrCat("worker '", self_.name, "' has shut down"));
    }
    if (handler_ != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("start() called twice on worker '", self_.name, "'"));
    }
    handler_ = std::make_shared<const RequestHandler>(std::move(handler));
  }
  // After what the progress thread is doing now, which may defer one more.
  post([this] { serve_deferred(); });
  return absl::OkStatus();
}

void State::serve_deferred() {
  std::shared_ptr<const RequestHandler> handler;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    handler = handler_;
  }
  std::vector<Deferred> deferred;
  deferred.swap(deferred_);
  for (Deferred& entry : deferred) {
    run_handler(*handler, entry.rank, std::move(entry.request));
  }
}

// ----------------------------------------------------- any-thread helpers

bool State::post(std::function<void()> command) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    commands_.push_back(std::move(command));
  }
  wake();
  return true;
}

void State::wake() {
  // Pairs with idle(): it sets sleeping_ before it looks at commands_ for
  // the last time, and we look at sleeping_ after adding to commands_.
  if (!sleeping_.load()) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t written = ::write(event_fd_, &one, sizeof(one));
}

bool State::has_commands() {
  absl::MutexLock lock(&mu_);
  return !commands_.empty() || closed_;
}

void State::finish_handling() {
  absl::MutexLock lock(&mu_);
  --incoming_active_;
}

// ------------------------------------------------------------- public API

Future<Message> State::send(const WorkerInfo& to, Message request,
                            absl::Duration timeout) {
  int rank = -1;
  {
    absl::MutexLock lock(&names_mu_);
    auto peer = rank_by_name_.find(to.name);
    if (peer != rank_by_name_.end()) rank = peer->second;
  }
  if (rank < 0) {
    return Future<Message>::ready(absl::UnavailableError(
        absl::StrCat("worker '", to.name, "' is not in the group of worker '",
                     self_.name, "'")));
  }
  for (const c10::Storage& storage : request.storages) {
    if (!storage.device().is_cpu()) {
      return Future<Message>::ready(absl::InvalidArgumentError(absl::StrCat(
          "the libfabric backend moves CPU storages only; a ",
          message_type_name(request.type), " to worker '", to.name,
          "' has one on ", storage.device().str())));
    }
  }
  absl::StatusOr<PendingRequests::Request> pending;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return Future<Message>::ready(
          common::sent_after_shutdown(self_.name, request.type, to.name));
    }
    // Under mu_, so that shutdown() fails it.
    pending = pending_.add(timeout,
                           absl::StrCat(message_type_name(request.type),
                                        " request to worker '", to.name, "'"));
    if (pending.ok()) {
      commands_.push_back(
          [this, rank, id = pending->id, request = std::move(request)]() mutable {
            start_request(rank, id, std::move(request));
          });
    }
  }
  if (!pending.ok()) return Future<Message>::ready(pending.status());
  wake();
  return std::move(pending->response);
}

absl::Status State::join(absl::Duration timeout) {
  return common::join_agent(
      joiner_, pending_,
      [this] {
        absl::MutexLock lock(&mu_);
        return incoming_active_;
      },
      [this] {
        absl::MutexLock lock(&mu_);
        return closed_;
      },
      self_.name, timeout, common::liveness_of(this, peer_timeout_));
}

void State::shutdown() {
  const bool on_own_thread =
      t_progress_of == this || TimerQueue::running_owner() == this;
  if (!shutdown_.begin(on_own_thread)) return;
  // Joined (and destroyed) outside the lock: the handler, the deferred
  // requests and the commands may hold user objects.
  struct Resources {
    std::thread progress;
    std::unique_ptr<TimerQueue> timers;
    std::shared_ptr<const RequestHandler> handler;
    std::deque<std::function<void()>> commands;
  };
  auto resources = std::make_shared<Resources>();
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    resources->progress = std::move(progress_);
    resources->timers = std::move(timers_);
    resources->handler = std::move(handler_);
    resources->commands.swap(commands_);
  }
  // Before the timers go.
  pending_.cancel_all(absl::CancelledError(absl::StrCat(
      "worker '", self_.name, "' shut down with the request pending")));
  // The progress thread sees closed_, says goodbye and closes the fabric.
  if (event_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t written = ::write(event_fd_, &one, sizeof(one));
  }
  shutdown_.finish(on_own_thread, [resources, self = shared_from_this()] {
    if (resources->progress.joinable()) resources->progress.join();
    resources->timers.reset();
  });
}

absl::StatusOr<LibfabricStats> State::stats() {
  auto result = std::make_shared<std::optional<LibfabricStats>>();
  auto done = std::make_shared<absl::Notification>();
  if (!post([this, result, done] {
        LibfabricStats stats = stats_;
        const MrCache::Stats cache = mr_cache_->stats();
        stats.mr_cache_hits = cache.hits;
        stats.mr_cache_misses = cache.misses;
        stats.mr_cache_evictions = cache.evictions;
        *result = std::move(stats);
        done->Notify();
      })) {
    return absl::CancelledError(
        absl::StrCat("worker '", self_.name, "' has shut down"));
  }
  if (!done->WaitForNotificationWithTimeout(kStatsBound)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the libfabric agent of worker '", self_.name,
        "' did not report its counters within ",
        absl::FormatDuration(kStatsBound)));
  }
  return **result;
}

// --------------------------------------------------------- progress loop

void State::run() {
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
    if (now - last_work < spin_) continue;
    woke_by_timeout = idle(next_tick, &poll_sleep, &nap);
  }
  teardown();
  t_progress_of = nullptr;
}

bool State::run_commands(bool* stop) {
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

bool State::idle(absl::Time next_tick, absl::Duration* poll_sleep,
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
    if (polled) {
      pollfd wakeups[2] = {{event_fd_, POLLIN, 0}, {doorbell_fd_, POLLIN, 0}};
      const timespec wait = absl::ToTimespec(timeout);
      ran_out = ::ppoll(wakeups, doorbell_fd_ >= 0 ? 2 : 1, &wait, nullptr) == 0;
    } else {
      fid* fids[] = {&fabric_->cq()->fid};
      if (fi_trywait(fabric_->fabric(), fids, 1) == FI_SUCCESS) {
        epoll_event events[2];
        const int ms = static_cast<int>(
            absl::ToInt64Milliseconds(timeout + absl::Microseconds(999)));
        ran_out = ::epoll_wait(epoll_fd_, events, 2, ms) == 0;
      }
    }
  }
  sleeping_.store(false);
  uint64_t count = 0;
  [[maybe_unused]] ssize_t got = ::read(event_fd_, &count, sizeof(count));
  return ran_out;
}

bool State::waiting() {
  return !queued_ranks_.empty() || !credit_due_.empty() ||
         !transfers_.empty() || !inflight_.empty() ||
         !pulls_waiting_.empty() || !sends_waiting_.empty() ||
         pending_.size() > 0;
}

bool State::poll_completions() {
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
    LOG(WARNING) << "libfabric agent of worker '" << self_.name
                 << "': fi_cq_read failed: "
                 << libfabric::internal::fi_error_text(static_cast<int>(-n));
  }
  return false;
}

int State::issue(Op* op) {
  fid_ep* ep = fabric_->ep();
  const fi_addr_t address =
      op->rank >= 0 ? peers_[op->rank].address : FI_ADDR_UNSPEC;
  ssize_t rc = 0;
  switch (op->kind) {
    case OpKind::kEagerReceive:
      rc = fi_trecv(ep, op->buffer, op->length, op->desc, FI_ADDR_UNSPEC,
                    op->tag, frame::kEagerIgnore, &op->context);
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

void State::post_receive(Op* op) {
  const int rc = issue(op);
  if (rc == -FI_EAGAIN) {
    refused_ = true;
    retry_.push_back(op);
  } else if (rc != 0) {
    LOG(ERROR) << "libfabric agent of worker '" << self_.name
               << "' cannot re-post an eager buffer: "
               << libfabric::internal::fi_error_text(-rc);
  }
}

void State::on_completion(Op* op, size_t length) {
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

void State::on_error(const fi_cq_err_entry& error) {
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
        LOG(WARNING) << "libfabric agent of worker '" << self_.name
                     << "': an eager receive failed: " << reason;
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

bool State::pump() {
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
      LOG(ERROR) << "libfabric agent of worker '" << self_.name
                 << "' cannot re-post an eager buffer: "
                 << libfabric::internal::fi_error_text(-rc);
    }
  }
  if (!sends_waiting_.empty()) worked |= pump_sends();
  for (size_t n = pulls_waiting_.size(); n > 0 && retry_.empty(); --n) {
    std::shared_ptr<Incoming> in = std::move(pulls_waiting_.front());
    pulls_waiting_.pop_front();
    const size_t before = in->next_chunk;
    pump_pull(in);
    worked |= in->next_chunk != before;
  }
  if (!queued_ranks_.empty()) {
    std::vector<int> ranks;
    ranks.swap(queued_ranks_);
    for (int rank : ranks) {
      Peer& peer = peers_[rank];
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

// ----------------------------------------------------------------- frames

void State::enqueue(int rank, OutFrame frame) {
  Peer& peer = peers_[rank];
  if (peer.lost) return;
  peer.queue.push_back(std::move(frame));
  flush(peer);
  if (!peer.queue.empty() && !peer.queued_listed) {
    peer.queued_listed = true;
    queued_ranks_.push_back(rank);
  }
}

void State::send_control(int rank, FrameKind kind, uint64_t arg0,
                         uint64_t arg1, uint64_t arg2) {
  OutFrame frame;
  frame.header.kind = kind;
  frame.header.arg0 = arg0;
  frame.header.arg1 = arg1;
  frame.header.arg2 = arg2;
  enqueue(rank, std::move(frame));
}

State::Sent State::transmit(Peer& peer, OutFrame& out, bool control) {
  if (control ? !peer.control_slot_free : peer.credits == 0) {
    if (!control) ++stats_.credit_waits;
    return Sent::kWait;
  }
  if (free_send_buffers_.empty() || !have_tx_room()) return Sent::kWait;
  const size_t length = frame::kHeaderSize + out.tail.size();
  TETHER_CHECK(length <= peer.buffer_size && length <= send_buffer_size_,
               "a libfabric frame larger than the peer's eager buffer");
  Op* op = send_ops_[free_send_buffers_.back()].get();
  FrameHeader header = out.header;
  header.src_rank = static_cast<uint32_t>(self_.id);
  header.credits = static_cast<uint16_t>(std::min<uint32_t>(peer.owed, 0xffff));
  if (peer.control_slot_owed) header.flags |= frame::kFlagReturnsControlSlot;
  if (control) header.flags |= frame::kFlagControlSlot;
  frame::write_header(header, op->buffer);
  if (!out.tail.empty()) {
    std::memcpy(op->buffer + frame::kHeaderSize, out.tail.data(),
                out.tail.size());
  }
  op->length = length;
  op->rank = peer.rank;
  const int rc = issue(op);
  if (rc == -FI_EAGAIN) {
    refused_ = true;
    return Sent::kWait;
  }
  if (rc != 0) {
    fail_peer(peer.rank, absl::UnavailableError(absl::StrCat(
                             "libfabric send from worker '", self_.name,
                             "' to ", describe(peer.rank), " failed: ",
                             libfabric::internal::fi_error_text(-rc))));
    return Sent::kFailed;
  }
  free_send_buffers_.pop_back();
  ++tx_inflight_;
  peer.owed -= header.credits;
  if (peer.control_slot_owed) peer.control_slot_owed = false;
  if (control) {
    peer.control_slot_free = false;
  } else {
    --peer.credits;
  }
  if (header.kind == FrameKind::kKeepaliveAck) peer.ack_queued = false;
  peer.talked = true;
  ++stats_.frames_sent;
  if (peer.doorbell_length > 0 && peer.rank != self_.id) {
    // A full doorbell already has a wake-up pending: EAGAIN is fine.
    const char ring = 0;
    ::sendto(doorbell_fd_, &ring, 1, MSG_DONTWAIT,
             reinterpret_cast<const sockaddr*>(&peer.doorbell),
             peer.doorbell_length);
  }
  stats_.max_frames_in_flight =
      std::max(stats_.max_frames_in_flight, in_flight(peer));
  return Sent::kSent;
}

bool State::flush(Peer& peer) {
  bool worked = false;
  while (!peer.queue.empty()) {
    const Sent sent = transmit(peer, peer.queue.front(), /*control=*/false);
    if (sent == Sent::kWait) break;
    worked = true;
    if (sent == Sent::kFailed) break;  // fail_peer() emptied the queue
    peer.queue.pop_front();
  }
  return worked;
}

bool State::send_due_credits() {
  bool worked = false;
  std::vector<int> ranks;
  ranks.swap(credit_due_);
  for (int rank : ranks) {
    Peer& peer = peers_[rank];
    peer.credit_listed = false;
    const uint32_t threshold = std::max<uint32_t>(1, credits_ / 2);
    if (peer.owed < threshold || peer.lost) continue;  // returned meanwhile
    OutFrame out;
    out.header.kind = FrameKind::kCredit;
    const Sent sent = transmit(peer, out, /*control=*/true);
    if (sent == Sent::kWait) {
      peer.credit_listed = true;
      credit_due_.push_back(rank);
      continue;
    }
    worked = true;
  }
  return worked;
}

void State::on_frame(Op* op, size_t length) {
  absl::string_view bytes(op->buffer, length);
  absl::StatusOr<FrameHeader> header = frame::read_header(bytes);
  const bool unknown = header.ok() && (header->src_rank >= peers_.size() ||
                                       absent(peers_[header->src_rank]));
  // In a dynamic group, a joiner's first word (its hello or a request) may
  // come before the Worker has been told of it, and its rank may be that of
  // a worker that is leaving.
  const bool first_word = header.ok() && dynamic_ &&
                          (header->kind == FrameKind::kAuth ||
                           header->kind == FrameKind::kRequest);
  if (unknown ||
      (first_word && peers_[header->src_rank].leaving)) {
    if (!first_word || !adopt_unknown(static_cast<int>(header->src_rank))) {
      header = absl::InvalidArgumentError(absl::StrCat(
          "source rank ", header->src_rank, " not in the group"));
    }
  }
  if (!header.ok()) {
    LOG(WARNING) << "libfabric agent of worker '" << self_.name
                 << "' drops a frame: " << header.status().message();
    return;
  }
  ++stats_.frames_received;
  Peer& peer = peers_[header->src_rank];
  heard_from(peer);
  peer.talked = true;
  peer.credits = std::min(peer.granted, peer.credits + header->credits);
  if (header->flags & frame::kFlagReturnsControlSlot) {
    peer.control_slot_free = true;
  }
  if (header->flags & frame::kFlagControlSlot) {
    peer.control_slot_owed = true;
  } else {
    ++peer.owed;
    if (peer.owed >= std::max<uint32_t>(1, credits_ / 2) &&
        !peer.credit_listed) {
      peer.credit_listed = true;
      credit_due_.push_back(peer.rank);
    }
  }
  // Credits may let queued frames go.
  if (!peer.queue.empty() && !peer.queued_listed) {
    peer.queued_listed = true;
    queued_ranks_.push_back(peer.rank);
  }
  if (!admitted(peer, *header)) return;
  switch (header->kind) {
    case FrameKind::kAuth:
      on_auth_frame(peer, bytes.substr(frame::kHeaderSize));
      return;
    case FrameKind::kRequest:
    case FrameKind::kResponse:
    case FrameKind::kError:
      on_message_frame(peer, *header, bytes.substr(frame::kHeaderSize));
      return;
    case FrameKind::kRelease: {
      auto it = transfers_.find(header->arg0);
      if (it != transfers_.end() && it->second->rank == peer.rank) {
        transfers_.erase(it);
        peer.transfers.erase(header->arg0);
      }
      return;
    }
    case FrameKind::kClearToSend:
      on_clear_to_send(peer, header->arg0, header->arg1, header->arg2);
      return;
    case FrameKind::kKeepalive:
      if (!peer.ack_queued) {
        peer.ack_queued = true;
        send_control(peer.rank, FrameKind::kKeepaliveAck);
      }
      return;
    case FrameKind::kKeepaliveAck:
    case FrameKind::kCredit:
      return;
    case FrameKind::kGoodbye:
      fail_peer(peer.rank,
                absl::UnavailableError(absl::StrCat(
                    describe(peer.rank), " has shut down (libfabric agent of "
                    "worker '", self_.name, "' was told)")));
      peer.gone = true;
      if (peer.leaving) {
        drop_peer(peer.rank, absl::UnavailableError(absl::StrCat(
                                 describe(peer.rank), " has left the group")));
      }
      return;
  }
}

// ---------------------------------------------------------- authentication

void State::send_auth(int rank, AuthFrame frame) {
  OutFrame out;
  out.header.kind = FrameKind::kAuth;
  out.tail = frame::write_auth(frame);
  enqueue(rank, std::move(out));
}

bool State::admitted(Peer& peer, const FrameHeader& header) {
  if (!auth_) return true;
  const bool client_ready = peer.client_auth == Peer::ClientAuth::kReady;
  const bool server_ready =
      peer.server_auth == Peer::ServerAuth::kAuthenticated;
  switch (header.kind) {
    case FrameKind::kAuth:
    case FrameKind::kKeepalive:
    case FrameKind::kKeepaliveAck:
    case FrameKind::kCredit:
      // The handshake itself, and what keeps frames and liveness going
      // (their only effect is in the header, on our own flow control).
      return true;
    case FrameKind::kRequest:
      if (server_ready) return true;
      break;
    case FrameKind::kResponse:
    case FrameKind::kError:
      if (client_ready) return true;
      break;
    case FrameKind::kRelease:
    case FrameKind::kClearToSend:
    case FrameKind::kGoodbye:
      if (client_ready || server_ready) return true;
      break;
  }
  LOG(WARNING) << "libfabric agent of worker '" << self_.name
               << "' drops a frame (kind " << static_cast<int>(header.kind)
               << ") from " << describe(peer.rank)
               << ", which has not authenticated";
  if (frame::carries_message(header.kind) && header.arg0 != 0) {
    // Its buffers are not pulled: let it release them.
    send_control(peer.rank, FrameKind::kRelease, header.arg0);
  }
  if (header.kind == FrameKind::kRequest) {
    refuse(peer, absl::StrCat("worker '", self_.name,
                              "' requires authentication and the peer sent a "
                              "request without it"));
  }
  return false;
}

void State::on_auth_frame(Peer& peer, absl::string_view tail) {
  absl::StatusOr<AuthFrame> frame = frame::read_auth(tail);
  if (!frame.ok()) {
    LOG(WARNING) << "libfabric agent of worker '" << self_.name
                 << "' drops an authentication frame from "
                 << describe(peer.rank) << ": " << frame.status().message();
    return;
  }
  const std::string& name = peer.name;
  switch (frame->step) {
    // ---- we serve its requests
    case AuthStep::kHello:
      if (!auth_) {
        refuse(peer, absl::StrCat("worker '", self_.name,
                                  "' does not authenticate peers (it has no "
                                  "secret); the group must agree on one"));
        return;
      }
      if (frame->name != name) {
        refuse(peer, absl::StrCat("rank ", peer.rank, " is worker '", name,
                                  "', not '", frame->name, "'"));
        return;
      }
      peer.server_auth = Peer::ServerAuth::kAwaitProof;
      peer.server_challenge = auth_->challenge();
      peer.hello_challenge = frame->challenge;
      send_auth(peer.rank,
                AuthFrame{AuthStep::kServerProof, self_.name,
                          peer.server_challenge,
                          auth_->prove(auth::Role::kServer, self_.name, name,
                                       frame->challenge,
                                       peer.server_challenge)});
      return;
    case AuthStep::kClientProof:
      if (!auth_ || peer.server_auth != Peer::ServerAuth::kAwaitProof) {
        refuse(peer, "an unexpected authentication step");
        return;
      }
      if (!auth_->verify(frame->proof, auth::Role::kClient, name, self_.name,
                         peer.server_challenge, peer.hello_challenge)) {
        refuse(peer, "authentication failed (a different secret?)");
        return;
      }
      peer.server_auth = Peer::ServerAuth::kAuthenticated;
      send_auth(peer.rank, AuthFrame{AuthStep::kAccepted, self_.name, "", ""});
      return;
    // ---- it serves our requests
    case AuthStep::kServerProof:
      if (!auth_ || peer.client_auth != Peer::ClientAuth::kHelloSent) break;
      if (frame->name != name ||
          !auth_->verify(frame->proof, auth::Role::kServer, name, self_.name,
                         peer.client_challenge, frame->challenge)) {
        fail_client_auth(
            peer, absl::UnauthenticatedError(absl::StrCat(
                      "worker '", name,
                      "' failed to authenticate (a different secret?)")));
        return;
      }
      peer.client_auth = Peer::ClientAuth::kProofSent;
      send_auth(peer.rank,
                AuthFrame{AuthStep::kClientProof, self_.name, "",
                          auth_->prove(auth::Role::kClient, self_.name, name,
                                       frame->challenge,
                                       peer.client_challenge)});
      return;
    case AuthStep::kAccepted: {
      if (!auth_ || peer.client_auth != Peer::ClientAuth::kProofSent) break;
      peer.client_auth = Peer::ClientAuth::kReady;
      std::deque<std::pair<int64_t, Message>> waiting;
      waiting.swap(peer.auth_waiting);
      for (auto& [id, request] : waiting) {
        if (!pending_.contains(id)) {  // timed out meanwhile
          peer.requests.erase(id);
          continue;
        }
        send_message(peer.rank, FrameKind::kRequest, id, 0,
                     std::move(request));
      }
      return;
    }
    case AuthStep::kRefused:
      if (peer.requests.empty() && peer.auth_waiting.empty() &&
          peer.client_auth == Peer::ClientAuth::kNone) {
        break;  // nothing of ours it could be about
      }
      if (!auth_) {
        fail_client_auth(
            peer, absl::UnauthenticatedError(absl::StrCat(
                      "worker '", name, "' requires authentication and worker '",
                      self_.name, "' has no secret (RpcOptions::auth_secret or ",
                      auth::kSecretEnv, "): ", frame->proof)));
      } else {
        fail_client_auth(peer, absl::UnauthenticatedError(absl::StrCat(
                                   "worker '", name, "' refused worker '",
                                   self_.name, "': ", frame->proof)));
      }
      return;
  }
  LOG(WARNING) << "libfabric agent of worker '" << self_.name
               << "' drops an out-of-turn authentication frame (step "
               << static_cast<int>(frame->step) << ") from "
               << describe(peer.rank);
}

void State::refuse(Peer& peer, const std::string& why) {
  LOG(WARNING) << "libfabric agent of worker '" << self_.name << "' refused "
               << describe(peer.rank) << ": " << why;
  peer.server_auth = Peer::ServerAuth::kNone;
  send_auth(peer.rank, AuthFrame{AuthStep::kRefused, self_.name, "", why});
}

void State::fail_client_auth(Peer& peer, const absl::Status& status) {
  LOG(WARNING) << "libfabric agent of worker '" << self_.name
               << "' fails its requests to " << describe(peer.rank) << ": "
               << status.message();
  peer.client_auth = Peer::ClientAuth::kNone;
  peer.auth_waiting.clear();
  std::vector<int64_t> ids(peer.requests.begin(), peer.requests.end());
  peer.requests.clear();
  for (int64_t id : ids) pending_.complete(id, status);
}

// --------------------------------------------------------------- messages

void State::start_request(int rank, int64_t id, Message request) {
  Peer& peer = peers_[rank];
  if (peer.lost) {
    pending_.complete(id, *peer.lost);
    return;
  }
  if (!pending_.set_connection(id, connection_of(peer))) return;  // timed out
  peer.requests.insert(id);
  request.id = id;
  if (auth_ && peer.client_auth != Peer::ClientAuth::kReady) {
    peer.auth_waiting.emplace_back(id, std::move(request));
    if (peer.client_auth == Peer::ClientAuth::kNone) {
      peer.client_challenge = auth_->challenge();
      peer.client_auth = Peer::ClientAuth::kHelloSent;
      send_auth(rank, AuthFrame{AuthStep::kHello, self_.name,
                                peer.client_challenge, ""});
    }
    return;
  }
  send_message(rank, FrameKind::kRequest, id, 0, std::move(request));
}

void State::respond(int rank, int64_t id,
                    const absl::StatusOr<Message>& result) {
  if (result.ok()) {
    send_message(rank, FrameKind::kResponse, id, 0, *result);
  } else {
    Message text;
    text.payload = std::string(result.status().message());
    send_message(rank, FrameKind::kError, id, result.status().raw_code(),
                 std::move(text));
  }
  finish_handling();
}

void State::send_message(int rank, FrameKind kind, int64_t id, int32_t code,
                         Message message) {
  Peer& peer = peers_[rank];
  auto fail = [&](const absl::Status& status) {
    if (kind == FrameKind::kRequest) {
      peer.requests.erase(id);
      pending_.complete(id, status);
    } else if (kind == FrameKind::kResponse) {
      Message text;
      text.payload = std::string(status.message());
      send_message(rank, FrameKind::kError, id, status.raw_code(),
                   std::move(text));
    }
    // An error that cannot go is dropped: its requester loses us or times
    // out.
  };
  if (peer.lost) {
    if (kind == FrameKind::kRequest) fail(*peer.lost);
    return;
  }
  for (const c10::Storage& storage : message.storages) {
    if (!storage.device().is_cpu()) {
      fail(absl::InvalidArgumentError(absl::StrCat(
          "the libfabric backend moves CPU storages only; a response of "
          "worker '",
          self_.name, "' has one on ", storage.device().str())));
      return;
    }
  }

  // Segment 0 is the payload, segment i + 1 storage i.
  std::vector<SegmentDesc> segments(1 + message.storages.size());
  segments[0].size = message.payload.size();
  for (size_t i = 0; i < message.storages.size(); ++i) {
    segments[i + 1].size = message.storages[i].nbytes();
  }
  bool any_remote = false;
  for (SegmentDesc& segment : segments) {
    if (segment.size >= threshold_) {
      segment.remote = true;
      any_remote = true;
    }
  }
  const uint64_t body = frame::body_size(segments);
  const bool body_remote =
      frame::kHeaderSize + frame::kMessageHeadSize + body > peer.buffer_size;

  OutFrame out;
  out.header.kind = kind;
  MessageHead head;
  head.type = message.type;
  head.code = code;
  head.id = id;
  head.body_size = body;

  std::shared_ptr<Transfer> transfer;
  std::vector<const char*> data(segments.size(), nullptr);
  Message* source = &message;
  if (any_remote || body_remote) {
    transfer = std::make_shared<Transfer>();
    transfer->id = next_transfer_++;
    transfer->rank = rank;
    transfer->message = std::move(message);
    source = &transfer->message;
  }
  data[0] = source->payload.data();
  for (size_t i = 0; i < source->storages.size(); ++i) {
    data[i + 1] = static_cast<const char*>(source->storages[i].data());
  }
  if (transfer != nullptr) {
    const bool read = peer.mode == RendezvousMode::kRead;
    const uint64_t access = read ? FI_REMOTE_READ : FI_SEND;
    transfer->segment_data = data;
    transfer->segment_desc.assign(segments.size(), nullptr);
    for (size_t i = 0; i < segments.size(); ++i) {
      if (!segments[i].remote) continue;
      const MemoryRegion* region = nullptr;
      if (i == 0) {
        absl::StatusOr<std::unique_ptr<MemoryRegion>> made =
            fabric_->register_memory(data[0], segments[0].size, access);
        if (!made.ok()) {
          fail(made.status());
          return;
        }
        transfer->payload_region = *std::move(made);
        region = transfer->payload_region.get();
      } else {
        absl::StatusOr<MrCache::Handle> handle =
            mr_cache_->acquire(source->storages[i - 1], access);
        if (!handle.ok()) {
          fail(handle.status());
          return;
        }
        transfer->storage_regions.push_back(*std::move(handle));
        region = &transfer->storage_regions.back().region();
      }
      transfer->segment_desc[i] = region->desc();
      if (read) {
        segments[i].address = region->remote_address(data[i]);
        segments[i].key = region->key();
      }
    }
    if (body_remote) {
      transfer->body.resize(body);
      frame::write_body(segments, data, transfer->body.data());
      absl::StatusOr<std::unique_ptr<MemoryRegion>> made =
          fabric_->register_memory(transfer->body.data(), body, access);
      if (!made.ok()) {
        fail(made.status());
        return;
      }
      transfer->body_region = *std::move(made);
      out.header.flags |= frame::kFlagBodyRemote;
      if (read) {
        head.body_address =
            transfer->body_region->remote_address(transfer->body.data());
        head.body_key = transfer->body_region->key();
      }
    }
    if (!read) {
      absl::Status planned = absl::OkStatus();
      if (body_remote) {
        planned = frame::plan_body_chunks(body, chunk_size_, transfer->chunks);
      }
      if (planned.ok()) {
        planned = frame::plan_chunks(segments, chunk_size_, transfer->chunks);
      }
      if (!planned.ok()) {
        fail(absl::InvalidArgumentError(absl::StrCat(
            "a message too large for the libfabric backend: ",
            planned.message())));
        return;
      }
      transfer->sequence_base = next_sequence_;
      next_sequence_ += transfer->chunks.size();
    }
    out.header.arg0 = transfer->id;
    out.header.arg1 = transfer->sequence_base;
    out.header.arg2 = chunk_size_;
    transfers_[transfer->id] = transfer;
    peer.transfers.insert(transfer->id);
    ++stats_.rendezvous_sent;
  }
  out.tail.resize(frame::kMessageHeadSize + (body_remote ? 0 : body));
  frame::write_message_head(head, out.tail.data());
  if (!body_remote) {
    frame::write_body(segments, data,
                      out.tail.data() + frame::kMessageHeadSize);
  }
  enqueue(rank, std::move(out));
}

void State::on_message_frame(Peer& peer, const FrameHeader& header,
                             absl::string_view rest) {
  const int rank = peer.rank;
  const uint64_t transfer = header.arg0;
  absl::StatusOr<MessageHead> head = frame::read_message_head(rest);
  if (!head.ok()) {
    LOG(WARNING) << "libfabric agent of worker '" << self_.name
                 << "' drops a message from " << describe(rank) << ": "
                 << head.status().message();
    if (transfer != 0) send_control(rank, FrameKind::kRelease, transfer);
    return;
  }
  if (header.kind != FrameKind::kRequest && !peer.requests.contains(head->id)) {
    // A response to a request that timed out (or a stray one): let its
    // buffers go unread.
    if (transfer != 0) send_control(rank, FrameKind::kRelease, transfer);
    return;
  }
  auto in = std::make_shared<Incoming>();
  in->rank = rank;
  in->kind = header.kind;
  in->head = *head;
  in->transfer = transfer;
  in->sequence_base = header.arg1;
  in->chunk_size = header.arg2;
  if (header.kind == FrameKind::kRequest) {
    in->message.type = head->type;
    in->message.id = head->id;
  }
  absl::Status status = absl::OkStatus();
  const bool remote = transfer != 0;
  if (remote && (in->chunk_size < frame::kMinChunkSize ||
                 in->chunk_size > fabric_->max_message_size())) {
    status = absl::InvalidArgumentError(
        absl::StrCat("chunk size ", in->chunk_size, " from ", describe(rank)));
  }
  if (status.ok() && (header.flags & frame::kFlagBodyRemote)) {
    if (!remote) {
      status = absl::InvalidArgumentError("a remote body without a transfer");
    } else if (head->body_size > frame::max_body_size(limits_)) {
      // Before allocating it: no message within the limits has one as large.
      status = absl::ResourceExhaustedError(absl::StrCat(
          "a message body of ", head->body_size,
          " bytes is over what the limits allow (MessageLimits: ",
          limits_.max_payload_bytes, " payload bytes, ", limits_.max_storages,
          " storages, ", limits_.max_storage_bytes, " storage bytes)"));
    } else {
      in->pulling_body = true;
      try {
        in->body.resize(head->body_size);
      } catch (const std::exception& e) {
        status = absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate a message body of ",
                         head->body_size, " bytes: ", e.what()));
      }
      if (status.ok()) {
        absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
            fabric_->register_memory(
                in->body.data(), in->body.size(),
                mode_ == RendezvousMode::kRead ? FI_READ : FI_RECV);
        if (region.ok()) {
          in->body_region = *std::move(region);
          status = frame::plan_body_chunks(head->body_size, in->chunk_size,
                                           in->chunks);
        } else {
          status = region.status();
        }
      }
    }
  } else if (status.ok()) {
    absl::string_view body = rest.substr(frame::kMessageHeadSize);
    if (body.size() != head->body_size) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "an inline body of ", body.size(), " bytes announced as ",
          head->body_size));
    } else {
      status = set_up_segments(*in, body);
    }
  }
  if (remote) {
    peer.incoming.insert(in);
    ++stats_.rendezvous_received;
  }
  if (!status.ok()) {
    in->error = status;
    finish_incoming(in);
    return;
  }
  if (in->chunks.empty()) {
    finish_incoming(in);
    return;
  }
  pump_pull(in);
}

absl::Status State::set_up_segments(Incoming& in, absl::string_view bytes) {
  absl::StatusOr<Body> body = frame::read_body(bytes);
  if (!body.ok()) return body.status();
  if (in.kind == FrameKind::kError && body->segments.size() != 1) {
    return absl::InvalidArgumentError("storages in an error message");
  }
  // Before allocating anything for it (storages, pulls).
  if (absl::Status within = frame::check_limits(*body, limits_); !within.ok()) {
    return within;
  }
  Message& message = in.message;
  try {
    message.payload.resize(body->segments[0].size);
    message.storages.reserve(body->segments.size() - 1);
    for (size_t i = 1; i < body->segments.size(); ++i) {
      message.storages.emplace_back(c10::Storage::use_byte_size_t(),
                                    static_cast<size_t>(body->segments[i].size),
                                    c10::GetCPUAllocator(),
                                    /*resizable=*/false);
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a message of ", body->segments.size(),
        " segments: ", e.what()));
  }
  in.segment_regions.resize(body->segments.size());
  bool any_remote = false;
  for (size_t i = 0; i < body->segments.size(); ++i) {
    const SegmentDesc& segment = body->segments[i];
    char* destination =
        i == 0 ? message.payload.data()
               : static_cast<char*>(message.storages[i - 1].data());
    if (!segment.remote) {
      if (segment.size > 0) {
        std::memcpy(destination, body->inline_data[i], segment.size);
      }
      continue;
    }
    any_remote = true;
    absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
        fabric_->register_memory(
            destination, segment.size,
            mode_ == RendezvousMode::kRead ? FI_READ : FI_RECV);
    if (!region.ok()) return region.status();
    in.segment_regions[i] = *std::move(region);
  }
  if (any_remote && in.transfer == 0) {
    return absl::InvalidArgumentError("remote segments without a transfer");
  }
  in.segments = std::move(body->segments);
  return frame::plan_chunks(in.segments, in.chunk_size, in.chunks);
}

void State::pump_pull(const std::shared_ptr<Incoming>& in) {
  const bool read = mode_ == RendezvousMode::kRead;
  while (in->next_chunk < in->chunks.size() && in->error.ok()) {
    if (read ? !have_tx_room() : rx_inflight_ >= rx_limit_) break;
    const Chunk& chunk = in->chunks[in->next_chunk];
    auto op = std::make_unique<Op>();
    op->kind = read ? OpKind::kRead : OpKind::kBulkReceive;
    op->rank = in->rank;
    op->length = chunk.length;
    op->incoming = in;
    if (chunk.segment == frame::kBodySegment) {
      op->buffer = in->body.data() + chunk.offset;
      op->desc = in->body_region->desc();
      op->remote_address = in->head.body_address + chunk.offset;
      op->key = in->head.body_key;
    } else {
      const SegmentDesc& segment = in->segments[chunk.segment];
      char* base = chunk.segment == 0
                       ? in->message.payload.data()
                       : static_cast<char*>(in->message.storages[chunk.segment - 1]
                                                .data());
      op->buffer = base + chunk.offset;
      op->desc = in->segment_regions[chunk.segment]->desc();
      op->remote_address = segment.address + chunk.offset;
      op->key = segment.key;
    }
    op->tag = frame::bulk_tag(static_cast<uint32_t>(in->rank),
                              in->sequence_base + in->next_chunk);
    const int rc = issue(op.get());
    if (rc == -FI_EAGAIN) {
      refused_ = true;
      break;
    }
    if (rc != 0) {
      in->error = absl::UnavailableError(absl::StrCat(
          "libfabric ", read ? "fi_read" : "fi_trecv", " by worker '",
          self_.name, "' from ", describe(in->rank), " failed: ",
          libfabric::internal::fi_error_text(-rc)));
      break;
    }
    if (read) {
      ++tx_inflight_;
    } else {
      ++rx_inflight_;
    }
    ++in->outstanding;
    ++in->next_chunk;
    inflight_.insert(op.release());
  }
  if (!read && in->next_chunk > in->announced) {
    send_control(in->rank, FrameKind::kClearToSend, in->transfer,
                 in->announced, in->next_chunk - in->announced);
    in->announced = in->next_chunk;
  }
  if (!in->error.ok()) {
    if (in->outstanding == 0) finish_incoming(in);
    return;
  }
  if (in->next_chunk < in->chunks.size()) pulls_waiting_.push_back(in);
}

void State::on_pulled(Op* raw, const absl::Status& status) {
  std::unique_ptr<Op> op(raw);
  inflight_.erase(raw);
  if (op->kind == OpKind::kRead) {
    --tx_inflight_;
  } else {
    --rx_inflight_;
  }
  std::shared_ptr<Incoming> in = std::move(op->incoming);
  --in->outstanding;
  if (status.ok()) {
    ++in->completed;
    stats_.bytes_pulled += op->length;
  } else if (in->error.ok()) {
    in->error = status;
  }
  op.reset();
  if (in->abandoned) return;
  if (!in->error.ok()) {
    if (in->outstanding == 0) finish_incoming(in);
    return;
  }
  if (in->completed < in->chunks.size()) {
    // More to issue (unless waiting already for room).
    if (in->next_chunk < in->chunks.size() &&
        std::find(pulls_waiting_.begin(), pulls_waiting_.end(), in) ==
            pulls_waiting_.end()) {
      pump_pull(in);
    }
    return;
  }
  if (in->pulling_body) {
    in->pulling_body = false;
    const std::string body = std::move(in->body);
    in->body_region.reset();
    absl::Status set = set_up_segments(*in, body);
    if (!set.ok()) {
      in->error = set;
      finish_incoming(in);
      return;
    }
    if (in->completed < in->chunks.size()) {
      pump_pull(in);
      return;
    }
  }
  finish_incoming(in);
}

void State::finish_incoming(const std::shared_ptr<Incoming>& in) {
  Peer& peer = peers_[in->rank];
  peer.incoming.erase(in);
  in->segment_regions.clear();
  in->body_region.reset();
  if (in->abandoned) return;
  in->abandoned = true;  // done: later completions of it do nothing
  if (in->transfer != 0) send_control(in->rank, FrameKind::kRelease, in->transfer);
  if (in->error.ok()) {
    deliver(*in);
    return;
  }
  const absl::Status error = in->error;
  if (in->kind == FrameKind::kRequest) {
    Message text;
    text.payload = absl::StrCat("libfabric agent of worker '", self_.name,
                                "' could not receive a ",
                                message_type_name(in->head.type), " from ",
                                describe(in->rank), ": ", error.message());
    send_message(in->rank, FrameKind::kError, in->head.id, error.raw_code(),
                 std::move(text));
    return;
  }
  if (peer.requests.erase(in->head.id) > 0) {
    pending_.complete(in->head.id,
                      absl::Status(error.code(),
                                   absl::StrCat("receiving the response from ",
                                                describe(in->rank), ": ",
                                                error.message())));
  }
}

void State::deliver(Incoming& in) {
  Peer& peer = peers_[in.rank];
  switch (in.kind) {
    case FrameKind::kRequest:
      handle_request(in.rank, std::move(in.message));
      return;
    case FrameKind::kResponse:
      if (peer.requests.erase(in.head.id) > 0) {
        in.message.type = in.head.type;
        in.message.id = in.head.id;
        pending_.complete(in.head.id, std::move(in.message));
      }
      return;
    case FrameKind::kError:
      if (peer.requests.erase(in.head.id) > 0) {
        pending_.complete(in.head.id,
                          status_from_code(in.head.code,
                                           std::move(in.message.payload)));
      }
      return;
    default:
      return;
  }
}

void State::on_clear_to_send(Peer& peer, uint64_t transfer, uint64_t first,
                             uint64_t count) {
  auto it = transfers_.find(transfer);
  if (it == transfers_.end() || it->second->rank != peer.rank) return;
  const std::shared_ptr<Transfer>& found = it->second;
  if (first > found->chunks.size() || count > found->chunks.size() - first) {
    LOG(WARNING) << "libfabric agent of worker '" << self_.name << "': "
                 << describe(peer.rank) << " asks for chunks " << first
                 << " + " << count << " of " << found->chunks.size();
    return;
  }
  sends_waiting_.push_back(SendRange{found, first, first + count});
  pump_sends();
}

bool State::pump_sends() {
  bool worked = false;
  while (!sends_waiting_.empty()) {
    SendRange& range = sends_waiting_.front();
    const std::shared_ptr<Transfer>& transfer = range.transfer;
    if (peers_[transfer->rank].lost) {
      sends_waiting_.pop_front();
      continue;
    }
    while (range.next < range.end && have_tx_room()) {
      const Chunk& chunk = transfer->chunks[range.next];
      auto op = std::make_unique<Op>();
      op->kind = OpKind::kBulkSend;
      op->rank = transfer->rank;
      op->length = chunk.length;
      op->transfer = transfer;
      const char* base = chunk.segment == frame::kBodySegment
                             ? transfer->body.data()
                             : transfer->segment_data[chunk.segment];
      op->buffer = const_cast<char*>(base) + chunk.offset;
      op->desc = chunk.segment == frame::kBodySegment
                     ? transfer->body_region->desc()
                     : transfer->segment_desc[chunk.segment];
      op->tag = frame::bulk_tag(static_cast<uint32_t>(self_.id),
                                transfer->sequence_base + range.next);
      const int rc = issue(op.get());
      if (rc == -FI_EAGAIN) {
        refused_ = true;
        return worked;
      }
      worked = true;
      ++range.next;
      if (rc != 0) {
        fail_peer(transfer->rank,
                  absl::UnavailableError(absl::StrCat(
                      "libfabric bulk send from worker '", self_.name,
                      "' to ", describe(transfer->rank), " failed: ",
                      libfabric::internal::fi_error_text(-rc))));
        break;
      }
      ++tx_inflight_;
      inflight_.insert(op.release());
    }
    if (range.next < range.end && !peers_[transfer->rank].lost) break;
    sends_waiting_.pop_front();
  }
  return worked;
}

void State::handle_request(int rank, Message request) {
  std::shared_ptr<const RequestHandler> handler;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    ++incoming_active_;
    handler = handler_;
  }
  if (handler == nullptr) {
    // Served by the serve_deferred() that start() posts.
    deferred_.push_back(Deferred{rank, std::move(request)});
    return;
  }
  run_handler(*handler, rank, std::move(request));
}

void State::run_handler(const RequestHandler& handler, int rank,
                        Message request) {
  const int64_t id = request.id;
  Future<Message> response =
      common::call_handler(handler, std::move(request), self_.name);
  response.on_complete([weak = weak_from_this(), rank,
                        id](const absl::StatusOr<Message>& result) {
    std::shared_ptr<State> state = weak.lock();
    if (state == nullptr) return;
    State* raw = state.get();
    auto shared = std::make_shared<absl::StatusOr<Message>>(result);
    if (!state->post([raw, rank, id, shared] { raw->respond(rank, id, *shared); })) {
      state->finish_handling();  // shut down: the response is dropped
    }
  });
}

// ------------------------------------------------------------------ peers

void State::heard_from(Peer& peer) {
  peer.last_heard = absl::Now();
  if (peer.lost && !peer.gone) {
    LOG(INFO) << "libfabric agent of worker '" << self_.name << "': "
              << describe(peer.rank) << " is back";
    peer.lost.reset();
  }
}

void State::fail_peer(int rank, const absl::Status& status) {
  Peer& peer = peers_[rank];
  if (peer.lost) return;
  if (!peer.requests.empty() || !peer.transfers.empty() ||
      !peer.incoming.empty()) {
    LOG(WARNING) << "libfabric agent of worker '" << self_.name
                 << "' fails what waits on " << describe(rank) << ": "
                 << status.message();
  }
  peer.lost = status;
  pending_.fail_connection(connection_of(peer), status);
  // A handshake in progress is abandoned; the next request starts anew.
  peer.auth_waiting.clear();
  peer.client_auth = Peer::ClientAuth::kNone;
  ++peer.epoch;
  peer.requests.clear();
  peer.queue.clear();
  for (uint64_t id : peer.transfers) transfers_.erase(id);
  peer.transfers.clear();
  // Their regions stay registered until their pulls in flight end.
  for (const std::shared_ptr<Incoming>& in : peer.incoming) {
    in->abandoned = true;
  }
  peer.incoming.clear();
  pulls_waiting_.erase(
      std::remove_if(pulls_waiting_.begin(), pulls_waiting_.end(),
                     [rank](const std::shared_ptr<Incoming>& in) {
                       return in->rank == rank;
                     }),
      pulls_waiting_.end());
  peer.expecting_since = absl::InfiniteFuture();
}

void State::housekeeping(absl::Time now) {
  mr_cache_->drop_unheld();
  if (listener_guard_ != nullptr && now - last_guard_sweep_ >= kGuardInterval) {
    last_guard_sweep_ = now;
    const ListenerGuard::Swept swept = listener_guard_->sweep(now);
    if (swept.reset > 0) {
      stats_.strangers_reset += swept.reset;
      LOG(WARNING) << "libfabric agent of worker '" << self_.name << "' reset "
                   << swept.reset
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
  for (Peer& peer : peers_) {
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
    if (peer.same_host && peer.pid > 0 && ::kill(peer.pid, 0) != 0 &&
        errno == ESRCH) {
      fail_peer(peer.rank,
                absl::UnavailableError(absl::StrCat(
                    describe(peer.rank), " is lost: its process (pid ",
                    peer.pid, ") is gone")));
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
                absl::UnavailableError(absl::StrCat(
                    describe(peer.rank), " is lost: no word from it for ",
                    absl::FormatDuration(silence),
                    " while worker '", self_.name,
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

void State::teardown() {
  if (fabric_ != nullptr && fabric_->ep() != nullptr && !peers_.empty() &&
      !send_ops_.empty()) {
    // Goodbyes, so that peers fail what waits for us at once.
    size_t said = 0;
    for (Peer& peer : peers_) {
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
  deferred_.clear();
  for (Peer& peer : peers_) {
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

// ------------------------------------------------------------------- agent

using LibfabricAgent = common::SharedStateAgent<State>;

absl::StatusOr<std::unique_ptr<Agent>> create_agent(AgentSetup setup) {
  if (setup.store == nullptr) {
    return absl::InvalidArgumentError(
        "the libfabric backend needs the group's rendezvous store");
  }
  absl::StatusOr<Settings> settings =
      libfabric::internal::parse_settings(setup.settings);
  if (!settings.ok()) return settings.status();
  auto state = std::make_shared<State>(std::move(setup), *std::move(settings));
  if (absl::Status initialized = state->init(); !initialized.ok()) {
    state->shutdown();
    return initialized;
  }
  return std::make_unique<LibfabricAgent>(std::move(state));
}

}  // namespace

Backend libfabric_backend(
    absl::flat_hash_map<std::string, std::string> defaults) {
  Backend backend;
  backend.name = kBackendName;
  backend.viable = [defaults]() -> absl::Status {
    absl::StatusOr<Settings> settings =
        libfabric::internal::parse_settings(defaults);
    if (!settings.ok()) return settings.status();
    return libfabric::internal::probe(settings->provider);
  };
  backend.create = [defaults](AgentSetup setup) {
    for (const auto& [key, value] : defaults) {
      setup.settings.try_emplace(key, value);
    }
    return create_agent(std::move(setup));
  };
  return backend;
}

absl::StatusOr<LibfabricStats> libfabric_stats(Agent& agent) {
  auto* libfabric = dynamic_cast<LibfabricAgent*>(&agent);
  if (libfabric == nullptr) {
    return absl::InvalidArgumentError("not an agent of the libfabric backend");
  }
  return libfabric->state().stats();
}

}  // namespace tether::backends
