// The agent skeleton under a tiny in-test transport ("mailbox": requests
// and responses posted between agents of this process, one io thread per
// agent). The transport is only hooks; everything the skeleton owns (send's
// prologue, start, join, the shutdown order, creation) passes the agent
// conformance suite, and the tests below check what it adds on its own.
#include "backends/common/agent_skeleton.h"

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <utility>

#include "backends/common/refusals.h"
#include "core/toolkit/serial_executor.h"
#include "testing/agent_conformance.h"
#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::backends::common {
namespace {

using ::testing::HasSubstr;
using tether::internal::SerialExecutor;
using tether::testing::AgentGroup;
using tether::testing::kBound;
using tether::testing::StatusIs;

constexpr BackendNames kNames{"mailbox", "Mailbox", "tether/mailbox/"};
// The worker of this rank publishes an address no peer can use.
constexpr char kUnreachableKey[] = "mailbox.unreachable_rank";
// The transport cannot be readied for a joiner of this name (add_peer()).
constexpr char kRefusedPeerKey[] = "mailbox.refused_peer";

struct Settings {
  int unreachable_rank = -1;
  std::string refused_peer;
};

absl::StatusOr<Settings> parse_settings(
    const absl::flat_hash_map<std::string, std::string>& raw) {
  Settings settings;
  for (const auto& [key, value] : raw) {
    if (key == kRefusedPeerKey) {
      settings.refused_peer = value;
      continue;
    }
    if (key != kUnreachableKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown mailbox setting '", key, "'"));
    }
    if (!absl::SimpleAtoi(value, &settings.unreachable_rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " is not a rank: '", value, "'"));
    }
  }
  return settings;
}

thread_local const void* t_io_of = nullptr;

class Mailbox;

// The process's mailboxes by address.
class Directory {
 public:
  static Directory& get() {
    static auto* const directory = new Directory();
    return *directory;
  }
  std::string add(std::weak_ptr<Mailbox> box) {
    absl::MutexLock lock(&mu_);
    std::string address = absl::StrCat("box-", next_++);
    boxes_[address] = std::move(box);
    return address;
  }
  void remove(const std::string& address) {
    absl::MutexLock lock(&mu_);
    boxes_.erase(address);
  }
  std::shared_ptr<Mailbox> find(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto it = boxes_.find(address);
    return it == boxes_.end() ? nullptr : it->second.lock();
  }

 private:
  absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::weak_ptr<Mailbox>> boxes_
      ABSL_GUARDED_BY(mu_);
};

// A response's way back: the agent that sent the request.
using Route = std::weak_ptr<Mailbox>;

class Mailbox : public AgentSkeleton<Mailbox, Route> {
 public:
  Mailbox(AgentSetup setup, Settings settings)
      : AgentSkeleton(setup, kNames),
        settings_(settings),
        io_(std::make_unique<SerialExecutor>()) {}

  absl::Status init() {
    address_ = Directory::get().add(weak_from_this());
    return publish_addresses(
        self_.id == settings_.unreachable_rank ? "" : address_, kBound);
  }

  // The workers on_peer_removed() was told of.
  std::vector<std::string> removed() {
    absl::MutexLock lock(&mu_);
    return removed_;
  }

 private:
  friend class AgentSkeleton<Mailbox, Route>;

  struct Resources {
    std::unique_ptr<SerialExecutor> io;
  };

  bool on_own_thread() const { return t_io_of == this; }
  void take_resources(Resources& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    out.io = std::move(io_);
  }
  void close_resources(Resources& /*resources*/) {
    Directory::get().remove(address_);
  }
  void join_resources(Resources& resources) {
    if (resources.io != nullptr) resources.io->stop();
  }
  absl::StatusOr<std::string> address_of(const std::string& published) {
    return published;
  }
  absl::Status on_peer_added(const Peer& peer) {
    if (peer.info.name != settings_.refused_peer) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("no mailbox for worker '", peer.info.name, "'"));
  }
  void on_peer_removed(const WorkerInfo& worker) {
    absl::MutexLock lock(&mu_);
    removed_.push_back(worker.name);
  }

  Future<Message> start_send(const Peer& peer, Message request,
                             PendingRequests::Request pending) {
    const int64_t id = pending.id;
    std::shared_ptr<Mailbox> target = Directory::get().find(peer.address);
    const bool posted =
        target != nullptr &&
        target->post([route = weak_from_this(),
                      request = std::move(request)](Mailbox& callee) mutable {
          callee.arrived(route, std::move(request));
        });
    if (!posted) {
      fail_later(id, absl::UnavailableError(absl::StrCat(
                         "worker '", peer.info.name, "' is gone")));
    }
    return std::move(pending.response);
  }

  void arrived(const Route& route, Message request) {
    std::vector<uint64_t> storage_bytes;
    for (const c10::Storage& storage : request.storages) {
      storage_bytes.push_back(storage.nbytes());
    }
    absl::Status within =
        check_message_limits(request.payload.size(), storage_bytes, limits_);
    if (!within.ok()) {
      deliver(route, request.id, within);
      return;
    }
    incoming_.arrived(route, std::move(request));
  }

  void send_response(const Route& route, int64_t id,
                     const absl::StatusOr<Message>& result) {
    deliver(route, id, result);
    incoming_.answered();
  }

  void deliver(const Route& route, int64_t id,
               const absl::StatusOr<Message>& result) {
    if (std::shared_ptr<Mailbox> sender = route.lock()) {
      sender->post(
          [id, result](Mailbox& self) { self.pending_.complete(id, result); });
    }
  }

  void run_deferred_later(Incoming::Deferred deferred) {
    post([deferred = std::move(deferred)](Mailbox& self) mutable {
      self.incoming_.run_deferred(std::move(deferred));
    });
  }

  // Runs `task` on the io thread; false once shut down.
  bool post(std::function<void(Mailbox&)> task) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    return io_->post([weak = weak_from_this(), task = std::move(task)] {
      std::shared_ptr<Mailbox> self = weak.lock();
      if (self == nullptr) return;
      ScopedMark mark(t_io_of, self.get());
      task(*self);
    });
  }

  const Settings settings_;
  std::string address_;  // set by init(), then const
  std::unique_ptr<SerialExecutor> io_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> removed_ ABSL_GUARDED_BY(mu_);
};

Backend mailbox_backend() {
  Backend backend;
  backend.name = kNames.name;
  backend.viable = [] { return absl::OkStatus(); };
  backend.create = [](AgentSetup setup) {
    return create_agent<Mailbox>(kNames, std::move(setup), parse_settings);
  };
  return backend;
}

// Holds the refusal thread until released, so that a test can see that a
// refused send has not completed inside send().
class RefusalThreadHeld {
 public:
  RefusalThreadHeld() {
    on_refusal_thread([release = release_] { release->WaitForNotification(); });
  }
  ~RefusalThreadHeld() { release(); }
  void release() {
    if (!release_->HasBeenNotified()) release_->Notify();
  }

 private:
  std::shared_ptr<absl::Notification> release_ =
      std::make_shared<absl::Notification>();
};

TEST(AgentSkeleton, SendAfterShutdownIsCancelledOffTheCallersThread) {
  AgentGroup group(mailbox_backend(), 2);
  ASSERT_TRUE(group.ok());
  group.start_all(tether::testing::echo);
  group[0].shutdown();
  RefusalThreadHeld held;
  Future<Message> refused =
      group[0].send(group[1].self(), tether::testing::ping("late"), kBound);
  EXPECT_FALSE(refused.is_ready());
  held.release();
  EXPECT_THAT(refused.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("worker 'agent0' has shut down; cannot "
                                 "send PING to 'agent1'")));
}

TEST(AgentSkeleton, UnknownPeerIsUnavailableOffTheCallersThread) {
  AgentGroup group(mailbox_backend(), 1);
  ASSERT_TRUE(group.ok());
  group.start_all(tether::testing::echo);
  RefusalThreadHeld held;
  Future<Message> refused = group[0].send(WorkerInfo{"stranger", 7},
                                          tether::testing::ping("x"), kBound);
  EXPECT_FALSE(refused.is_ready());
  held.release();
  EXPECT_THAT(refused.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker 'stranger' is not in the group of "
                                 "worker 'agent0'")));
}

TEST(AgentSkeleton, PeerWithoutASharedTransportIsUnavailable) {
  AgentGroup group(mailbox_backend(), 2, {{kUnreachableKey, "1"}});
  ASSERT_TRUE(group.ok());
  group.start_all(tether::testing::echo);
  EXPECT_THAT(
      group[0]
          .send(group[1].self(), tether::testing::ping("x"), kBound)
          .get(absl::Now() + kBound),
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr("worker 'agent1' shares no mailbox transport with "
                         "'agent0'")));
  // The other way works.
  EXPECT_THAT(group[1]
                  .send(group[0].self(), tether::testing::ping("y"), kBound)
                  .get(absl::Now() + kBound),
              tether::testing::IsOk());
}

TEST(AgentSkeleton, TcpEndpointIsReadFromAPublishedRecord) {
  auto is = [](const std::optional<Endpoint>& e, const std::string& ip,
               int port) {
    return e.has_value() && e->ip == ip && e->port == port;
  };
  EXPECT_TRUE(is(tcp_endpoint("10.0.0.2:29500"), "10.0.0.2", 29500));
  EXPECT_TRUE(is(tcp_endpoint("shm=tp_1\nuv=127.0.0.1:4242\n"), "127.0.0.1",
                 4242));
  EXPECT_TRUE(is(tcp_endpoint("tcp=[::1]:80"), "::1", 80));
  EXPECT_FALSE(tcp_endpoint("shm=tp_1\n").has_value());
  EXPECT_FALSE(tcp_endpoint("").has_value());
  EXPECT_FALSE(tcp_endpoint("host:port").has_value());
  EXPECT_FALSE(tcp_endpoint("host:70000").has_value());
}

TEST(AgentSkeleton, EndpointOfAWorkerIsWhatItPublished) {
  AgentGroup group(mailbox_backend(), 2);
  ASSERT_TRUE(group.ok());
  // The mailbox publishes no host and port: none, for itself and a peer.
  absl::StatusOr<std::optional<Endpoint>> mine =
      group[0].endpoint_of(group[0].self());
  ASSERT_THAT(mine, tether::testing::IsOk());
  EXPECT_FALSE(mine->has_value());
  ASSERT_THAT(group[0].endpoint_of(group[1].self()), tether::testing::IsOk());
  EXPECT_THAT(group[0].endpoint_of(WorkerInfo{"stranger", 7}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("worker 'stranger' (rank 7) is not in the "
                                 "group")));
}

TEST(AgentSkeleton, CreationNeedsTheStoreAndKnownSettings) {
  AgentSetup setup;
  setup.self = {"w", 0};
  setup.workers = {setup.self};
  EXPECT_THAT(mailbox_backend().create(setup),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the mailbox backend needs the group's "
                                 "rendezvous store")));
  AgentGroup group(mailbox_backend(), 1, {{"mailbox.colour", "red"}});
  EXPECT_THAT(group.error(0), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("mailbox.colour")));
}

TEST(AgentSkeleton, PendingRequestFailsWithTheSharedShutdownText) {
  AgentGroup group(mailbox_backend(), 2);
  ASSERT_TRUE(group.ok());
  auto held = std::make_shared<tether::testing::HeldResponses>();
  group.start_all(
      [held](Message request) { return held->hold(std::move(request)); });
  Future<Message> pending =
      group[0].send(group[1].self(), tether::testing::ping("held"), kBound);
  held->wait_for(1);
  group[0].shutdown();
  EXPECT_THAT(pending.get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("worker 'agent0' shut down with the "
                                 "request pending")));
  held->release_all();
}

// A dynamic group on `store`: "a" (rank 0) alone, then "b" (rank 1)
// joining it; "a" has `settings`. Both answer with echo.
struct DynamicPair {
  explicit DynamicPair(tether::testing::AgentSettings settings = {}) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    AgentSetup setup;
    setup.dynamic = true;
    setup.store =
        std::shared_ptr<c10d::Store>(store.get(), [store](c10d::Store*) {});
    setup.self = {"a", 0};
    setup.workers = {setup.self};
    setup.settings = std::move(settings);
    absl::StatusOr<std::unique_ptr<Agent>> created =
        mailbox_backend().create(setup);
    if (created.ok()) a = *std::move(created);
    status = created.status();
    setup.self = {"b", 1};
    setup.workers = {{"a", 0}, setup.self};
    setup.settings.clear();
    created = mailbox_backend().create(setup);
    if (created.ok()) b = *std::move(created);
    if (status.ok()) status = created.status();
    if (status.ok()) status = a->start(tether::testing::echo);
    if (status.ok()) status = b->start(tether::testing::echo);
  }
  absl::Status status;
  std::unique_ptr<Agent> a;
  std::unique_ptr<Agent> b;
};

Mailbox& mailbox_of(Agent& agent) {
  return dynamic_cast<SharedStateAgent<Mailbox>&>(agent).state();
}

TEST(AgentSkeleton, AddPeerReadiesTheBackendAndRemovePeerTellsItOnce) {
  DynamicPair pair;
  ASSERT_THAT(pair.status, tether::testing::IsOk());
  ASSERT_THAT(pair.a->add_peer(pair.b->self()), tether::testing::IsOk());
  EXPECT_THAT(pair.a->send(pair.b->self(), tether::testing::ping("hi"), kBound)
                  .get(absl::Now() + kBound),
              tether::testing::IsOk());
  pair.a->remove_peer(pair.b->self());
  pair.a->remove_peer(pair.b->self());  // not known any more: no news
  EXPECT_THAT(mailbox_of(*pair.a).removed(), ::testing::ElementsAre("b"));
  EXPECT_THAT(pair.a->send(pair.b->self(), tether::testing::ping("x"), kBound)
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker 'b' is not in the group")));
}

TEST(AgentSkeleton, AddPeerFailingInTheBackendLeavesThePeerOut) {
  DynamicPair pair(tether::testing::AgentSettings{{kRefusedPeerKey, "b"}});
  ASSERT_THAT(pair.status, tether::testing::IsOk());
  EXPECT_THAT(pair.a->add_peer(pair.b->self()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no mailbox for worker 'b'")));
  EXPECT_THAT(pair.a->send(pair.b->self(), tether::testing::ping("x"), kBound)
                  .get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("worker 'b' is not in the group")));
  // Nothing was removed that the backend had readied.
  EXPECT_THAT(mailbox_of(*pair.a).removed(), ::testing::IsEmpty());
}

}  // namespace
}  // namespace tether::backends::common

TETHER_AGENT_CONFORMANCE_TEST(Skeleton,
                              tether::backends::common::mailbox_backend(),
                              tether::testing::kLocalPeers);
