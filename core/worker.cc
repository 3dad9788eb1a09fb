#include "core/worker.h"

#include <absl/container/inlined_vector.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <c10/core/thread_pool.h>
#include <glog/logging.h>
#include <signal.h>


#include <algorithm>
#include <cstdlib>
#include <optional>
#include <utility>

#include "core/huge_pages.h"
#include "core/internal/blas_check.h"
#include "core/ivalue_future.h"
#include "core/join/membership.h"
#include "core/profiling.h"
#include "core/rendezvous.h"
#include "core/toolkit/store_client.h"
#include "core/wire/codec.h"
#include "core/wire/profiled.h"

namespace tether {
namespace {

thread_local Worker* serving_worker = nullptr;

// Whether this thread is in a handler the Worker called on arrival
// (HandlerTraits::serve_on_arrival), not on the pool.
thread_local bool serving_on_arrival = false;

// Marks the current thread as serving `worker` for its scope.
class ServingScope {
 public:
  explicit ServingScope(Worker* worker) : previous_(serving_worker) {
    serving_worker = worker;
  }
  ~ServingScope() { serving_worker = previous_; }

 private:
  Worker* previous_;
};

// The part of the codec's limits an agent checks (AgentSetup::limits).
MessageLimits message_limits(const wire::Limits& limits) {
  MessageLimits out;
  out.max_payload_bytes = limits.max_payload_bytes;
  out.max_storages = limits.max_storages;
  out.max_storage_bytes = limits.max_storage_bytes;
  return out;
}

}  // namespace

// An exception message: the tuple (status code, text).
Message Worker::exception_message(const absl::Status& status) {
  Message message;
  message.type = MessageType::kException;
  c10::IValue value = c10::ivalue::Tuple::create(
      {c10::IValue(static_cast<int64_t>(status.code())),
       c10::IValue(std::string(status.message()))});
  // Two scalars always encode; a failure here is our bug.
  absl::Status encoded = wire::encode(value, message);
  TETHER_CHECK(encoded.ok(), "encoding an exception message");
  return message;
}

absl::Status Worker::status_of_exception(const Message& message) {
  absl::StatusOr<c10::IValue> value = wire::decode(message);
  if (!value.ok()) return value.status();
  if (!value->isTuple() || value->toTupleRef().elements().size() != 2 ||
      !value->toTupleRef().elements()[0].isInt() ||
      !value->toTupleRef().elements()[1].isString()) {
    return absl::InvalidArgumentError(
        "malformed EXCEPTION message: expected (int, str)");
  }
  int64_t code = value->toTupleRef().elements()[0].toInt();
  std::string text = value->toTupleRef().elements()[1].toStringRef();
  if (code <= 0 ||
      code > static_cast<int64_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed EXCEPTION message: status code ", code, ": ", text));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), text);
}

// Libraries tether drives write to sockets without MSG_NOSIGNAL (TensorPipe's
// shm transport does): a peer that closes first would kill this process
// with SIGPIPE. A write to a closed socket must be an error of that write.
// Only a default disposition is changed: a program's own handler stays.
namespace {
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL && !(current.sa_flags & SA_SIGINFO)) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
}

// busy_poll, when set, polls whatever the load; else spare_core_poll polls
// on spare cores only.
PollPolicy poll_policy(const RpcOptions& options) {
  if (options.busy_poll > absl::ZeroDuration()) {
    return PollPolicy{options.busy_poll, /*only_on_spare_cores=*/false};
  }
  return PollPolicy{std::max(options.spare_core_poll, absl::ZeroDuration()),
                    /*only_on_spare_cores=*/true};
}
}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::create(
    const std::string& name, int rank, int world_size,
    const RpcOptions& options, const BackendRegistry& registry,
    const std::vector<ExtensionFactory>& extensions) {
  ignore_sigpipe();
  internal::warn_if_blas_unsafe();
  // THP_MEM_ALLOC_ENABLE=1 (as PyTorch 2.1 and later read it): large
  // tensors on huge pages. A value that is not an integer is an error; an
  // allocator the user installed above tether's is kept, with a warning.
  if (absl::Status huge = use_huge_pages_if_asked(); !huge.ok()) {
    if (huge.code() == absl::StatusCode::kInvalidArgument) return huge;
    LOG(WARNING) << huge.message();
  }
#ifdef TETHER_NO_MUTEX_DEADLOCK_DETECTION
  // Debian's Abseil checks every lock for deadlock cycles (it is built
  // without NDEBUG): a graph update per acquisition on every hot path.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  if (options.max_calls_in_flight < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_calls_in_flight must not be negative, got ",
        options.max_calls_in_flight));
  }
  if (options.num_worker_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_worker_threads must be at least 1, got ",
        options.num_worker_threads));
  }
  absl::StatusOr<const Backend*> backend = registry.find(options.backend);
  if (!backend.ok()) return backend.status();
  if (absl::Status viable = (*backend)->viable(); !viable.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend '", options.backend, "' cannot run here: ", viable.message()));
  }
  absl::StatusOr<std::optional<auth::Authenticator>> authenticator =
      auth::Authenticator::from(options.auth_secret);
  if (!authenticator.ok()) return authenticator.status();
  absl::StatusOr<RendezvousResult> group = rendezvous(
      options.init_method, name, rank, world_size, options.init_timeout);
  if (!group.ok()) return group.status();
  // A store request that its server leaves unanswered for the peer timeout
  // fails, as a PING does: a worker cut off from the store's host ends its
  // join within the peer timeout, not the init timeout.
  c10d::Store* store = group->store.get();
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store)) {
    store = prefixed->getUnderlyingStore().get();
  }
  if (auto* client = dynamic_cast<internal::TcpStoreClient*>(store)) {
    client->set_request_timeout(options.peer_timeout);
  }

  // A dynamic group: the join runs under the group's membership token, from
  // here until every member knows this worker (or it gives up: then its
  // claims go and the members it told are told it left).
  std::unique_ptr<join::MembershipToken> token;
  std::vector<WorkerInfo> members;
  if (group->dynamic) {
    absl::StatusOr<std::unique_ptr<join::MembershipToken>> taken =
        join::MembershipToken::acquire(
            group->store, group->self, join::MembershipToken::Op::kJoin,
            options.peer_timeout, absl::Now() + options.init_timeout);
    if (!taken.ok()) return taken.status();
    token = *std::move(taken);
    const char* rejoin_env = std::getenv("TETHER_REJOIN");
    if (options.rejoin ||
        (rejoin_env != nullptr && std::string(rejoin_env) == "1")) {
      // The lost incarnation's claims and place in the list (only those
      // with this very name and rank) go; the members learn of the new one
      // by its MEMBER_JOIN.
      if (absl::Status forgot = token->forget(group->self); !forgot.ok()) {
        return forgot;
      }
    }
    if (absl::Status claimed = token->claim(); !claimed.ok()) {
      return absl::Status(
          claimed.code(),
          absl::StrCat(named_worker(group->self), " cannot join the group at '",
                       options.init_method, "': ", claimed.message()));
    }
    absl::StatusOr<std::vector<WorkerInfo>> listed = token->members();
    if (!listed.ok()) {
      (void)token->forget(group->self);
      return listed.status();
    }
    members = *std::move(listed);
    group->workers = members;
    group->workers.push_back(group->self);
    std::sort(group->workers.begin(), group->workers.end(),
              [](const WorkerInfo& a, const WorkerInfo& b) {
                return a.id < b.id;
              });
  }
  // Undoes the claims of a join that fails from here on.
  auto unclaim = [&token, &group](absl::Status why) {
    if (token != nullptr) (void)token->forget(group->self);
    return why;
  };

  AgentSetup setup;
  setup.self = group->self;
  setup.workers = group->workers;
  setup.dynamic = group->dynamic;
  setup.store = group->store;
  setup.group_key = group->group_key;
  setup.rendezvous_host = group->host;
  setup.settings = options.backend_settings;
  setup.limits = message_limits(options.limits);
  setup.auth = *std::move(authenticator);
  setup.peer_timeout = options.peer_timeout;
  setup.poll = poll_policy(options);
  internal::poll_waits_with(setup.poll);
  absl::StatusOr<std::unique_ptr<Agent>> agent =
      (*backend)->create(std::move(setup));
  if (!agent.ok()) return unclaim(agent.status());

  std::unique_ptr<Worker> worker(new Worker(options, std::move(*agent)));
  worker->dynamic_ = group->dynamic;
  worker->store_ = group->store;
  {
    absl::MutexLock lock(&worker->members_mu_);
    worker->members_ = worker->agent_->worker_infos();
  }
  for (const std::string& source : options.scripts) {
    if (absl::Status added = worker->register_script(source); !added.ok()) {
      return unclaim(added);
    }
  }
  for (const ExtensionFactory& factory : extensions) {
    absl::StatusOr<std::unique_ptr<WorkerExtension>> extension =
        factory(*worker);
    if (!extension.ok()) return unclaim(extension.status());
    if (absl::Status hooked = worker->take_hooks(**extension); !hooked.ok()) {
      return unclaim(hooked);
    }
    worker->extensions_.push_back(*std::move(extension));
  }
  if (absl::Status started = worker->start_collectives(); !started.ok()) {
    return started;
  }
  worker->building_ = false;
  Worker* raw = worker.get();
  absl::Status started = worker->agent_->start(
      [raw](Message request) { return raw->handle_request(std::move(request)); });
  if (!started.ok()) return unclaim(started);
  if (token != nullptr) {
    if (absl::Status joined = worker->announce_join(*token, std::move(members));
        !joined.ok()) {
      return unclaim(joined);
    }
  }
  return worker;
}

Worker::Worker(RpcOptions options, std::unique_ptr<Agent> agent)
    : options_(std::move(options)),
      default_timeout_ns_(-1),
      lifeline_(std::make_shared<internal::Lifeline<Worker>>(*this)),
      pool_(std::make_unique<c10::ThreadPool>(options_.num_worker_threads)),
      agent_(std::move(agent)) {
  set_rpc_timeout(options_.default_timeout);
}

Worker::~Worker() {
  absl::Status stopped = shutdown(/*graceful=*/false);
  (void)stopped;  // A non-graceful shutdown cannot fail.
  // A function's future that completes from now on answers nobody.
  lifeline_->close();
  // Extensions go first, while everything they may touch still exists.
  extensions_.clear();
}

Worker* Worker::serving() { return serving_worker; }

absl::Status Worker::register_handler(MessageType type,
                                      RequestHandler handler,
                                      HandlerTraits traits) {
  TETHER_CHECK(building_, "register_handler after the worker started");
  if (type == MessageType::kCall || type == MessageType::kProfiledRequest ||
      !handler) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot register a handler for ", message_type_name(type)));
  }
  if (!handlers_.emplace(type, std::move(handler)).second) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a handler for ", message_type_name(type), " is already registered"));
  }
  if (traits.counts_as_call) counted_as_calls_.insert(type);
  if (traits.profiled) profiled_types_.insert(type);
  if (traits.serve_on_arrival) served_on_arrival_.insert(type);
  return absl::OkStatus();
}

absl::Status Worker::take_hooks(WorkerExtension& extension) {
  wire::ReferenceHook* references = extension.reference_hook();
  ContextHook* contexts = extension.context_hook();
  if ((references != nullptr && reference_hook_ != nullptr) ||
      (contexts != nullptr && context_hook_ != nullptr)) {
    return absl::InvalidArgumentError(
        "two extensions of one worker give a reference hook or a context "
        "hook (at most one each)");
  }
  if (references != nullptr) reference_hook_ = references;
  if (contexts != nullptr) context_hook_ = contexts;
  return absl::OkStatus();
}

absl::Status Worker::add_callable_provider(
    std::string prefix, std::shared_ptr<CallableProvider> provider) {
  TETHER_CHECK(building_, "add_callable_provider after the worker started");
  return callables_.add_provider(std::move(prefix), std::move(provider));
}

Worker::ServingContext::ServingContext(const Worker& worker,
                                       const wire::ContextMeta& request)
    : hook_(request.in_context() ? worker.context_hook_ : nullptr) {
  if (hook_ != nullptr) {
    previous_ = hook_->exchange_current_context(request.context_id);
  }
}

Worker::ServingContext::~ServingContext() {
  if (hook_ != nullptr) hook_->exchange_current_context(previous_);
}

void Worker::set_call_gate(CallGate gate, CallGateWaits waits) {
  TETHER_CHECK(building_, "set_call_gate after the worker started");
  call_gate_ = std::move(gate);
  call_gate_waits_ = std::move(waits);
}

absl::Status Worker::check_limits(const Message& message) const {
  absl::InlinedVector<uint64_t, 4> storage_bytes;
  storage_bytes.reserve(message.storages.size());
  for (const c10::Storage& storage : message.storages) {
    storage_bytes.push_back(storage.nbytes());
  }
  return check_message_limits(message.payload.size(), storage_bytes,
                              message_limits(options_.limits));
}

absl::Status Worker::encode(const c10::IValue& value, Message& out) {
  if (absl::Status s =
          wire::encode(value, out, reference_hook_, nullptr, options_.limits);
      !s.ok()) {
    return s;
  }
  return check_limits(out);
}

absl::Status Worker::encode_request(const c10::IValue& value,
                                    const WorkerInfo& to, Message& out) {
  wire::ContextMeta meta;
  if (context_hook_ != nullptr) {
    const int64_t context = context_hook_->current_context();
    if (context >= 0) {
      absl::StatusOr<wire::ContextMeta> sent =
          context_hook_->on_send(context, to, value);
      if (!sent.ok()) return sent.status();
      meta = *sent;
    }
  }
  if (absl::Status s =
          wire::encode(value, out, reference_hook_, &meta, options_.limits);
      !s.ok()) {
    return s;
  }
  return check_limits(out);
}

absl::Status Worker::encode_response(const c10::IValue& value,
                                     const wire::ContextMeta& request,
                                     Message& out) {
  wire::ContextMeta meta;
  if (context_hook_ != nullptr && request.in_context()) {
    absl::StatusOr<WorkerInfo> to = get_worker_info(To(request.from));
    if (!to.ok()) return to.status();
    absl::StatusOr<wire::ContextMeta> sent =
        context_hook_->on_send(request.context_id, *to, value);
    if (!sent.ok()) return sent.status();
    meta = *sent;
  }
  if (absl::Status s =
          wire::encode(value, out, reference_hook_, &meta, options_.limits);
      !s.ok()) {
    return s;
  }
  return check_limits(out);
}

absl::StatusOr<c10::IValue> Worker::decode(const Message& in,
                                           wire::ContextMeta* context) {
  wire::ContextMeta meta;
  absl::StatusOr<c10::IValue> value =
      wire::decode(in, options_.limits, reference_hook_, &meta);
  if (!value.ok()) return value;
  if (meta.in_context() && context_hook_ != nullptr) {
    if (absl::Status received = context_hook_->on_receive(meta, *value);
        !received.ok()) {
      return received;
    }
  }
  if (context != nullptr) *context = meta;
  return value;
}

Future<Message> Worker::send(const WorkerInfo& to, Message message,
                             absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kStopped) {
      return Future<Message>::ready(absl::CancelledError(absl::StrCat(
          "worker ", describe(agent_->self()), " is shut down; cannot send ",
          message_type_name(message.type))));
    }
  }
  return send_counted(to, std::move(message), timeout)
      .then([](const absl::StatusOr<Message>& response)
                -> absl::StatusOr<Message> {
        if (response.ok() && response->type == MessageType::kException) {
          return status_of_exception(*response);
        }
        return response;
      });
}

Future<Message> Worker::send_counted(const WorkerInfo& to, Message message,
                                     absl::Duration timeout) {
  if (dynamic_) {
    if (absl::Status member = count_send_to(to); !member.ok()) {
      return Future<Message>::ready(member);
    }
    Future<Message> response =
        send_limited(to, std::move(message), timeout);
    const int rank = to.id;
    response.on_complete(
        [this, rank](const absl::StatusOr<Message>&) { sent_to_done(rank); });
    return response;
  }
  return send_limited(to, std::move(message), timeout);
}

Future<Message> Worker::send_limited(const WorkerInfo& to,
                                               Message message,
                                               absl::Duration timeout) {
  // Read without a lock: counted_as_calls_ is fixed once the worker serves.
  const bool call = message.type == MessageType::kCall ||
                    counted_as_calls_.contains(message.type);
  if (!call || options_.max_calls_in_flight == 0) {
    return send_to_agent(to, std::move(message), resolve_timeout(timeout));
  }
  {
    absl::MutexLock lock(&mu_);
    if (calls_in_flight_ >= options_.max_calls_in_flight) {
      return Future<Message>::ready(absl::ResourceExhaustedError(absl::StrCat(
          "worker ", describe(agent_->self()), " has ", calls_in_flight_,
          " calls in flight, the limit (RpcOptions::max_calls_in_flight); ",
          "cannot send a ", message_type_name(message.type), " to worker ",
          describe(to))));
    }
    ++calls_in_flight_;
  }
  Future<Message> response =
      send_to_agent(to, std::move(message), resolve_timeout(timeout));
  response.on_complete([this](const absl::StatusOr<Message>&) {
    absl::MutexLock lock(&mu_);
    --calls_in_flight_;
  });
  return response;
}

bool Worker::profiled(MessageType type) const {
  // Read without a lock: profiled_types_ is fixed once the worker serves.
  return type == MessageType::kCall || profiled_types_.contains(type);
}

Future<Message> Worker::send_to_agent(const WorkerInfo& to, Message message,
                                      absl::Duration timeout) {
  if (!profiled(message.type) || !profiling::enabled()) {
    return agent_->send(to, std::move(message), timeout);
  }
  const std::string* key = profiling::CallKey::current();
  std::optional<profiling::Call> call = profiling::Call::begin(
      key != nullptr ? *key
                     : absl::StrCat(message_type_name(message.type), "(",
                                    agent_->self().name, " -> ", to.name,
                                    ")"));
  if (!call.has_value()) return agent_->send(to, std::move(message), timeout);
  absl::StatusOr<Message> wrapped =
      wire::wrap_profiled_request(std::move(message), call->settings());
  if (!wrapped.ok()) return Future<Message>::ready(wrapped.status());
  return agent_->send(to, *std::move(wrapped), timeout)
      .then([call = *std::move(call), to, limits = options_.limits](
                const absl::StatusOr<Message>& response)
                -> absl::StatusOr<Message> {
        // An EXCEPTION (the callee refused or failed it) comes unwrapped.
        if (!response.ok() ||
            response->type != MessageType::kProfiledResponse) {
          return response;
        }
        std::vector<wire::ProfiledEvent> events;
        absl::StatusOr<Message> inner =
            wire::unwrap_profiled_response(*response, events, limits);
        if (inner.ok() && (inner->type == MessageType::kProfiledResponse ||
                           inner->type == MessageType::kProfiledRequest)) {
          inner = absl::InvalidArgumentError(
              "malformed PROFILED_RESPONSE: it wraps another");
        }
        if (inner.ok()) {
          absl::Status added = call.add(std::move(events));
          if (!added.ok()) inner = added;
        }
        if (!inner.ok()) {
          return absl::Status(
              inner.status().code(),
              absl::StrCat("worker ", describe(to),
                           " answered a profiled request: ",
                           inner.status().message()));
        }
        return inner;
      });
}

absl::Status Worker::shutdown(bool graceful, absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) timeout = options_.shutdown_timeout;
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kRunning) return absl::OkStatus();
    state_ = graceful ? State::kDraining : State::kStopped;
  }
  absl::Status joined = absl::OkStatus();
  if (graceful) {
    for (const auto& extension : extensions_) {
      absl::Status s = extension->before_graceful_join();
      if (joined.ok()) joined = s;
    }
    auto all_joined = [this] {
      for (const auto& extension : extensions_) extension->on_group_joined();
    };
    if (dynamic_) all_joined();
    absl::Status drained =
        dynamic_ ? leave_group()
                 : agent_->join(timeout <= absl::ZeroDuration()
                                    ? absl::InfiniteDuration()
                                    : timeout,
                                all_joined);
    if (joined.ok()) joined = drained;
    for (const auto& extension : extensions_) {
      absl::Status s = extension->after_graceful_join();
      if (joined.ok()) joined = s;
    }
    absl::MutexLock lock(&mu_);
    state_ = State::kStopped;
  }
  agent_->shutdown();
  if (!pool_->inThreadPool()) pool_->waitWorkComplete();
  return joined;
}

absl::Status Worker::register_script(const std::string& source) {
  return callables_.add_script(source);
}

absl::StatusOr<WorkerInfo> Worker::get_worker_info(const To& to) const {
  absl::MutexLock lock(&members_mu_);
  const std::vector<WorkerInfo>& workers = members_;
  // A member that left, named (dynamic groups).
  auto left = [this](absl::string_view name, int rank)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(members_mu_)
                      -> std::optional<absl::Status> {
    for (const auto& [unused, info] : left_) {
      if (info.name == name || info.id == rank) {
        return absl::UnavailableError(
            absl::StrCat(named_worker(info), " has left the group of worker '",
                         agent_->self().name, "'"));
      }
    }
    return std::nullopt;
  };
  if (const auto* name = std::get_if<std::string>(&to.target())) {
    for (const WorkerInfo& info : workers) {
      if (info.name == *name) return info;
    }
    if (auto gone = left(*name, -1)) return *gone;
    // "could not find destination": the peer's words, which its users
    // match.
    return absl::NotFoundError(absl::StrCat("unknown worker '", *name,
                                            "': could not find destination"));
  }
  auto by_rank = [&workers](int rank) -> const WorkerInfo* {
    auto it = std::lower_bound(
        workers.begin(), workers.end(), rank,
        [](const WorkerInfo& info, int r) { return info.id < r; });
    return it != workers.end() && it->id == rank ? &*it : nullptr;
  };
  if (const int* rank = std::get_if<int>(&to.target())) {
    if (const WorkerInfo* info = by_rank(*rank)) return *info;
    if (auto gone = left("", *rank)) return *gone;
    return absl::NotFoundError(absl::StrCat(
        "unknown worker rank ", *rank, " (", workers.size(),
        dynamic_ ? " members)" : absl::StrCat(" workers, ranks 0 to ",
                                               workers.size() - 1, ")")));
  }
  const WorkerInfo& info = std::get<WorkerInfo>(to.target());
  const WorkerInfo* known = by_rank(info.id);
  if (known == nullptr || !(*known == info)) {
    if (auto gone = left(info.name, -1)) return *gone;
    return absl::NotFoundError(
        absl::StrCat("unknown worker ", describe(info)));
  }
  return info;
}

const WorkerInfo& Worker::get_current_worker_info() const {
  return agent_->self();
}

std::vector<WorkerInfo> Worker::get_all_worker_infos() const {
  absl::MutexLock lock(&members_mu_);
  return members_;
}

absl::Duration Worker::rpc_timeout() const {
  const int64_t ns = default_timeout_ns_.load(std::memory_order_relaxed);
  return ns < 0 ? absl::ZeroDuration() : absl::Nanoseconds(ns);
}

Worker::PoolInfo Worker::pool_info() const {
  return {static_cast<int64_t>(pool_->size()),
          static_cast<int64_t>(pool_->numAvailable())};
}

void Worker::set_rpc_timeout(absl::Duration timeout) {
  default_timeout_ns_.store(timeout <= absl::ZeroDuration() ||
                                    timeout == absl::InfiniteDuration()
                                ? -1
                                : absl::ToInt64Nanoseconds(timeout),
                            std::memory_order_relaxed);
}

absl::Duration Worker::resolve_timeout(absl::Duration timeout) const {
  if (timeout == kDefaultTimeout) timeout = rpc_timeout();
  if (timeout <= absl::ZeroDuration()) return absl::InfiniteDuration();
  return timeout;
}

Future<c10::IValue> Worker::rpc_async(const To& to, absl::string_view fn,
                                      std::vector<c10::IValue> args,
                                      Kwargs kwargs, absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kStopped) {
      return Future<c10::IValue>::ready(absl::CancelledError(absl::StrCat(
          "worker ", describe(agent_->self()),
          " is shut down; cannot call '", fn, "'")));
    }
  }
  absl::StatusOr<WorkerInfo> target = get_worker_info(to);
  if (!target.ok()) return Future<c10::IValue>::ready(target.status());

  // The name's string is shared by the call and its error messages.
  c10::IValue name{std::string(fn)};
  c10::IValue call = c10::ivalue::Tuple::create(
      {name, c10::ivalue::Tuple::create(std::move(args)),
       kwargs_to_wire(std::move(kwargs))});
  Message request;
  request.type = MessageType::kCall;
  if (absl::Status encoded = encode_request(call, *target, request);
      !encoded.ok()) {
    return Future<c10::IValue>::ready(absl::Status(
        encoded.code(),
        absl::StrCat("cannot send arguments of '", fn, "' to worker ",
                     describe(*target), ": ", encoded.message())));
  }
  Future<Message> sent = send_counted(*target, std::move(request), timeout);
  return sent.then(
      [this, name = std::move(name), callee = *std::move(target)](
          const absl::StatusOr<Message>& response)
          -> absl::StatusOr<c10::IValue> {
        const std::string& fn_name = name.toStringRef();
        if (!response.ok()) {
          return absl::Status(
              response.status().code(),
              absl::StrCat("call of '", fn_name, "' on worker ",
                           describe(callee), " failed: ",
                           response.status().message()));
        }
        if (response->type == MessageType::kException) {
          return status_of_exception(*response);
        }
        if (response->type != MessageType::kCallRet) {
          return absl::InvalidArgumentError(absl::StrCat(
              "worker ", describe(callee), " answered '", fn_name, "' with a ",
              message_type_name(response->type), " message"));
        }
        return decode(*response);
      });
}

absl::StatusOr<c10::IValue> Worker::rpc_sync(const To& to,
                                             absl::string_view fn,
                                             std::vector<c10::IValue> args,
                                             Kwargs kwargs,
                                             absl::Duration timeout) {
  return rpc_async(to, fn, std::move(args), std::move(kwargs), timeout).get();
}

namespace {

// A CALL this small is decoded on the agent's thread, and run there when it
// is a builtin operator (below): moving it to the pool would cost two
// thread hand-offs (to the pool, and the response back to the agent's
// thread), most of a small call's round trip.
constexpr int64_t kInlineCallBytes = 64 * 1024;

}  // namespace

bool Worker::decodes_on_arrival(const Message& request) {
  int64_t bytes = static_cast<int64_t>(request.payload.size());
  for (const c10::Storage& storage : request.storages) {
    bytes += static_cast<int64_t>(storage.nbytes());
  }
  return bytes <= kInlineCallBytes;
}

bool Worker::runs_on_arrival(absl::string_view fn,
                             const wire::ContextMeta& context) {
  return !context.in_context() && absl::StartsWith(fn, "aten::");
}

Future<Message> Worker::serve_on_pool(std::function<Future<Message>()> serve) {
  auto answer = [](const absl::StatusOr<Message>& response)
      -> absl::StatusOr<Message> {
    return response.ok() ? *response : exception_message(response.status());
  };
  // Called on the pool already (a profiled request is served there, under
  // its profiler's thread state, which must stay): served here.
  if (!serving_on_arrival) return serve().then(answer);
  Promise<Message> promise;
  run_on_pool([this, promise, serve = std::move(serve)] {
    ServingScope scope(this);
    serve().on_complete([promise](const absl::StatusOr<Message>& response) {
      promise.set(response.ok() ? *response
                                : exception_message(response.status()));
    });
  }, nullptr);
  return promise.future();
}

Future<Message> Worker::handle_request(Message request) {
  // On a user's thread that waits for its own answer: served as on a
  // fresh thread (profiling::pristine_thread_state).
  std::optional<at::ThreadLocalStateGuard> fresh;
  if (internal::in_wait_assist) {
    fresh.emplace(profiling::pristine_thread_state());
  }
  if (!dynamic_) return serve_request(std::move(request));
  {
    absl::MutexLock lock(&members_mu_);
    ++serving_;
  }
  Future<Message> response = serve_request(std::move(request));
  response.on_complete([this](const absl::StatusOr<Message>&) {
    absl::MutexLock lock(&members_mu_);
    --serving_;
  });
  return response;
}

void Worker::run_on_pool(std::function<void()> job,
                         const at::ThreadLocalState* tls) {
  if (tls == nullptr) {
    pool_->run(std::move(job));
    return;
  }
  pool_->run([state = *tls, job = std::move(job)] {
    at::ThreadLocalStateGuard guard(state);
    job();
  });
}

Future<Message> Worker::serve_profiled(Message wrapped) {
  const WorkerInfo& self = agent_->self();
  auto refuse = [&](const absl::Status& status) {
    return Future<Message>::ready(exception_message(absl::Status(
        status.code(), absl::StrCat("Error on worker ", describe(self), ": ",
                                    status.message()))));
  };
  wire::ProfilerSettings settings;
  absl::StatusOr<Message> inner = wire::unwrap_profiled_request(
      std::move(wrapped), settings, options_.limits);
  if (!inner.ok()) return refuse(inner.status());
  if (!profiled(inner->type)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "malformed PROFILED_REQUEST: it wraps a ",
        message_type_name(inner->type),
        ", not a request that runs user code")));
  }
  absl::StatusOr<std::shared_ptr<profiling::Serving>> serving =
      profiling::Serving::start(settings);
  if (!serving.ok()) return refuse(serving.status());
  Future<Message> response;
  {
    at::ThreadLocalStateGuard guard((*serving)->state());
    response = serve_request(*std::move(inner), &(*serving)->state());
  }
  return response.then(
      [serving = *std::move(serving), rank = self.id](
          const absl::StatusOr<Message>& served) -> absl::StatusOr<Message> {
        std::vector<wire::ProfiledEvent> events = serving->finish(rank);
        profiling::ServerProfiles::add(events);
        // A failure travels unwrapped, as it would unprofiled.
        if (!served.ok() || served->type == MessageType::kException) {
          return served;
        }
        absl::StatusOr<Message> out =
            wire::wrap_profiled_response(*served, events);
        if (!out.ok()) return exception_message(out.status());
        return out;
      });
}

Future<Message> Worker::serve_server_profiled(
    Message request, const wire::ProfilerSettings& settings) {
  absl::StatusOr<std::shared_ptr<profiling::Serving>> serving =
      profiling::Serving::start(settings);
  if (!serving.ok()) {
    LOG(WARNING) << "worker " << describe(agent_->self())
                 << " serves a request unprofiled: " << serving.status();
    const at::ThreadLocalState& fresh = profiling::pristine_thread_state();
    return serve_request(std::move(request), &fresh);
  }
  Future<Message> response;
  {
    at::ThreadLocalStateGuard guard((*serving)->state());
    response = serve_request(std::move(request), &(*serving)->state());
  }
  return response.then(
      [serving = *std::move(serving), rank = agent_->self().id](
          const absl::StatusOr<Message>& served) -> absl::StatusOr<Message> {
        profiling::ServerProfiles::add(serving->finish(rank));
        return served;
      });
}

Future<Message> Worker::serve_request(Message request,
                                      const at::ThreadLocalState* tls) {
  if (request.type == MessageType::kProfiledRequest && tls == nullptr) {
    return serve_profiled(std::move(request));
  }
  if (tls == nullptr && profiled(request.type)) {
    if (std::optional<wire::ProfilerSettings> settings =
            profiling::ServerProfiles::settings()) {
      return serve_server_profiled(std::move(request), *settings);
    }
  }
  if (request.type == MessageType::kMemberJoin ||
      request.type == MessageType::kMemberLeave) {
    return handle_membership(std::move(request));
  }
  // A liveness probe (a peer's graceful join asks whether this worker is
  // alive): answered here, on the agent's thread, however busy the pool is.
  if (request.type == MessageType::kPing) {
    Message pong;
    pong.type = MessageType::kPong;
    pong.id = request.id;
    return Future<Message>::ready(std::move(pong));
  }
  Promise<Message> promise;
  auto handler = handlers_.find(request.type);
  if (handler != handlers_.end()) {
    const RequestHandler* serve = &handler->second;
    if (tls == nullptr && served_on_arrival_.contains(request.type)) {
      ServingScope scope(this);
      const bool previous = serving_on_arrival;
      serving_on_arrival = true;
      Future<Message> response = (*serve)(std::move(request));
      serving_on_arrival = previous;
      return response.then([](const absl::StatusOr<Message>& response)
                               -> absl::StatusOr<Message> {
        return response.ok() ? *response : exception_message(response.status());
      });
    }
    auto shared = std::make_shared<Message>(std::move(request));
    run_on_pool([this, promise, shared, serve] {
      ServingScope scope(this);
      (*serve)(std::move(*shared))
          .on_complete([promise](const absl::StatusOr<Message>& response) {
            promise.set(response.ok() ? *response
                                      : exception_message(response.status()));
          });
    }, tls);
    return promise.future();
  }
  if (request.type == MessageType::kCall && decodes_on_arrival(request)) {
    ServingScope scope(this);
    auto call = std::make_shared<DecodedCall>();
    if (std::optional<Message> malformed = decode_call(request, *call)) {
      return Future<Message>::ready(*std::move(malformed));
    }
    // A builtin operator on small tensors runs here, on the agent's thread;
    // anything else on the pool (runs_on_arrival()).
    if (runs_on_arrival(call->fn, call->context) &&
        !(call_gate_waits_ && call_gate_waits_(call->value))) {
      return run_call(*call);
    }
    run_on_pool([this, promise, call] {
      ServingScope scope(this);
      run_call(*call).on_complete(
          [promise](const absl::StatusOr<Message>& response) {
            promise.set(response);
          });
    }, tls);
    return promise.future();
  }
  auto shared = std::make_shared<Message>(std::move(request));
  run_on_pool([this, promise, shared] {
    ServingScope scope(this);
    process_request(*shared).on_complete(
        [promise](const absl::StatusOr<Message>& response) {
          promise.set(response);
        });
  }, tls);
  return promise.future();
}

Future<Message> Worker::process_request(const Message& request) {
  const WorkerInfo& self = agent_->self();
  if (request.type != MessageType::kCall) {
    return Future<Message>::ready(exception_message(absl::InvalidArgumentError(
        absl::StrCat("worker ", describe(self), " cannot handle a ",
                     message_type_name(request.type), " request"))));
  }
  DecodedCall call;
  if (std::optional<Message> malformed = decode_call(request, call)) {
    return Future<Message>::ready(*std::move(malformed));
  }
  return run_call(call);
}

std::optional<Message> Worker::decode_call(const Message& request,
                                           DecodedCall& out) {
  const WorkerInfo& self = agent_->self();
  absl::StatusOr<c10::IValue> call = decode(request, &out.context);
  if (!call.ok()) {
    return exception_message(absl::Status(
        call.status().code(),
        absl::StrCat("Error on worker ", describe(self),
                     ": malformed CALL: ", call.status().message())));
  }
  // (name, args tuple, kwargs: None or a dict) as rpc_async builds it.
  if (!call->isTuple() || call->toTupleRef().elements().size() != 3 ||
      !call->toTupleRef().elements()[0].isString() ||
      !call->toTupleRef().elements()[1].isTuple() ||
      !is_wire_kwargs(call->toTupleRef().elements()[2])) {
    return exception_message(absl::InvalidArgumentError(absl::StrCat(
        "Error on worker ", describe(self),
        ": malformed CALL: expected (name, args, kwargs)")));
  }
  const auto& parts = call->toTupleRef().elements();
  out.fn = parts[0].toStringRef();
  out.args = parts[1].toTupleRef().elements().vec();
  absl::StatusOr<Kwargs> kwargs = kwargs_from_wire(parts[2]);
  if (!kwargs.ok()) {
    return exception_message(absl::InvalidArgumentError(
        absl::StrCat("Error on worker ", describe(self), " calling '", out.fn,
                     "': ", kwargs.status().message())));
  }
  out.kwargs = *std::move(kwargs);
  out.value = *std::move(call);
  return std::nullopt;
}

Future<Message> Worker::run_call(DecodedCall& call) {
  const WorkerInfo& self = agent_->self();
  const std::string& fn = call.fn;
  const wire::ContextMeta& context = call.context;
  ServingContext serving(*this, context);
  CallPass pass;
  if (call_gate_) {
    absl::StatusOr<CallPass> ready = call_gate_(call.value);
    if (!ready.ok()) {
      return Future<Message>::ready(exception_message(absl::Status(
          ready.status().code(),
          absl::StrCat("Error on worker ", describe(self), " calling '", fn,
                       "': ", ready.status().message()))));
    }
    pass = *std::move(ready);
  }
  absl::StatusOr<c10::IValue> result =
      callables_.call(fn, std::move(call.args), call.kwargs);
  if (!result.ok() || !result->isFuture()) {
    return Future<Message>::ready(response_to(fn, result, context));
  }
  // The function answers later: the response is made on the thread that
  // completes its future, and until then no thread of this worker waits.
  Promise<Message> response;
  settle(*std::move(result))
      .on_complete([lifeline = lifeline_, response, fn, context,
                    pass](const absl::StatusOr<c10::IValue>& value) {
        Message message;
        if (!lifeline->use([&](Worker& worker) {
              message = worker.response_to(fn, value, context);
            })) {
          message = exception_message(absl::CancelledError(absl::StrCat(
              "the worker that ran '", fn, "' shut down before it answered")));
        }
        response.set(std::move(message));
      });
  return response.future();
}

Message Worker::response_to(const std::string& fn,
                            const absl::StatusOr<c10::IValue>& result,
                            const wire::ContextMeta& context) {
  const WorkerInfo& self = agent_->self();
  if (!result.ok()) {
    return exception_message(absl::Status(
        result.status().code(),
        absl::StrCat("Error on worker ", describe(self), " calling '", fn,
                     "': ", result.status().message())));
  }
  Message response;
  response.type = MessageType::kCallRet;
  if (absl::Status encoded = encode_response(*result, context, response);
      !encoded.ok()) {
    return exception_message(absl::Status(
        encoded.code(),
        absl::StrCat("Error on worker ", describe(self), " calling '", fn,
                     "': cannot send its result: ", encoded.message())));
  }
  return response;
}

}  // namespace tether
