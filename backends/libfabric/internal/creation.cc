#include "backends/libfabric/internal/agent_state.h"

#include <absl/strings/match.h>
#include <c10/util/Logging.h>
#include <rdma/fi_errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "backends/libfabric/internal/shared_endpoints.h"
#include "core/toolkit/check.h"

namespace tether::backends::libfabric::internal {

namespace {

// Eager buffers hold the rendezvous threshold plus this much for the
// headers and segment descriptors.
constexpr uint64_t kBufferSlack = 1024;
// An inject size from which eager frames are held to it (see open_fabric()).
constexpr size_t kUsefulInjectSize = 2048;
// Large buffers move in pieces of at most this many bytes.
constexpr uint64_t kMaxChunk = uint64_t{16} << 20;
// Receive-queue entries kept for tagged bulk receives.
constexpr size_t kBulkReceiveReserve = 64;
// A dynamic group's agent sizes its credits for at least this many workers.
constexpr size_t kDynamicPlannedPeers = 8;
constexpr absl::Duration kMaxTick = absl::Milliseconds(100);

}  // namespace

absl::Status AgentState::open_fabric() {
  const size_t world = workers_.size();
  if (world > framing::kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("the libfabric backend supports groups of up to ",
                     framing::kMaxRanks, " workers, not ", world));
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

  // libfabric.spin_us, else the worker's busy poll.
  spin_ = settings_.spin > absl::ZeroDuration() ? settings_.spin : busy_poll_;
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

absl::Status AgentState::grow_pool(size_t peers) {
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
    op->tag = framing::kEagerTag;
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

absl::Status AgentState::exchange_records() {
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
  // Every worker's record, in rank order: a dynamic group's members
  // present now (joiners come through add_peer(), or their first frame).
  absl::Status published =
      publish_addresses(encode_record(mine), settings_.init_timeout);
  if (!published.ok()) return published;
  std::vector<std::pair<WorkerInfo, Record>> records;
  for (const WorkerInfo& worker : workers_) {
    std::optional<common::Peer> peer = peers_.by_rank(worker.id);
    TETHER_CHECK(peer.has_value(), "a worker of the group is not in its table");
    absl::StatusOr<Record> record = peer_record(worker, peer->address);
    if (!record.ok()) return record.status();
    records.emplace_back(worker, *std::move(record));
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
    op->tag = framing::kEagerTag;
    send_ops_.push_back(std::move(op));
    free_send_buffers_.push_back(kSendBuffers - 1 - i);
  }
  return absl::OkStatus();
}

absl::Status AgentState::set_up_wakeups() {
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
      LOG(WARNING) << who() << " has no doorbell: " << std::strerror(errno);
      if (doorbell_fd_ >= 0) ::close(doorbell_fd_);
      doorbell_fd_ = -1;
      return absl::OkStatus();
    }
    doorbell_name_.assign(address.sun_path,
                          length - offsetof(sockaddr_un, sun_path));
    return absl::OkStatus();
  }
  cq_fd_ = fabric_->wait_fd();
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

absl::Status AgentState::init() {
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

}  // namespace tether::backends::libfabric::internal
