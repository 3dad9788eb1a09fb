#include "core/rendezvous.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>
#include <absl/strings/numbers.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/toolkit/store_client.h"
#include "core/toolkit/store_wait.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <limits>

namespace tether {
namespace {

constexpr char kMemoryScheme[] = "memory://";
constexpr char kTcpScheme[] = "tcp://";
constexpr char kFileScheme[] = "file://";
constexpr char kEnvScheme[] = "env://";

// The first of `names` that is set in the environment, or "".
std::string first_env(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return value;
  }
  return "";
}

template <typename T>
std::shared_ptr<c10d::Store> share(c10::intrusive_ptr<T> store) {
  // c10d stores are intrusive_ptr; the shared_ptr holds one reference.
  T* raw = store.get();
  return std::shared_ptr<c10d::Store>(raw, [store](c10d::Store*) {});
}

// "host:port" -> a TCPStore; rank 0 serves it unless a launcher does
// (`launcher_serves`); a client's keys go under `prefix` when it is given.
absl::StatusOr<std::shared_ptr<c10d::Store>> open_tcp_store(
    absl::string_view host_port, int rank, absl::Duration timeout,
    bool launcher_serves = false, const std::string& prefix = "") {
  size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad TCP rendezvous address '", host_port, "'; expected HOST:PORT"));
  }
  std::string host(host_port.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (rank != 0 || launcher_serves) {
    // Not LibTorch's TCPStore client: its watch thread aborts the process or
    // spins when the server's process dies (core/toolkit/store_client.h).
    absl::StatusOr<c10::intrusive_ptr<internal::TcpStoreClient>> client =
        internal::TcpStoreClient::connect(host, port, timeout);
    if (!client.ok()) return client.status();
    if (prefix.empty()) return share(*std::move(client));
    return share(c10::make_intrusive<c10d::PrefixStore>(
        prefix, c10::intrusive_ptr<c10d::Store>(*std::move(client))));
  }
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;  // the rendezvous below waits, with names
  options.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  try {
    return share(c10::make_intrusive<c10d::TCPStore>(host, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve the rendezvous store at ", host, ":", port, ": ",
        e.what()));
  }
}

std::vector<uint8_t> to_bytes(absl::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string from_bytes(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

absl::StatusOr<std::shared_ptr<c10d::Store>> open_store(
    absl::string_view init_method, int rank, int world_size,
    absl::Duration timeout) {
  if (absl::StartsWith(init_method, kMemoryScheme)) {
    absl::string_view key = init_method.substr(sizeof(kMemoryScheme) - 1);
    if (key.empty()) {
      return absl::InvalidArgumentError(
          "init method 'memory://' needs a key, e.g. 'memory://my_test'");
    }
    static absl::Mutex mu(absl::kConstInit);
    static auto* stores = new absl::flat_hash_map<
        std::string, c10::intrusive_ptr<c10d::HashStore>>;
    absl::MutexLock lock(&mu);
    auto& store = (*stores)[std::string(key)];
    if (!store) store = c10::make_intrusive<c10d::HashStore>();
    return share(store);
  }
  if (absl::StartsWith(init_method, kTcpScheme)) {
    return open_tcp_store(init_method.substr(sizeof(kTcpScheme) - 1), rank,
                          timeout);
  }
  if (absl::StartsWith(init_method, kEnvScheme)) {
    std::string addr = first_env({"MASTER_ADDR"});
    std::string port = first_env({"MASTER_PORT"});
    if (addr.empty() || port.empty()) {
      return absl::InvalidArgumentError(
          "init method 'env://' needs MASTER_ADDR and MASTER_PORT set");
    }
    // torchrun's agent (and tether_run) serve the store themselves and say
    // so with this variable: then every rank, rank 0 too, is a client.
    const bool launcher_serves =
        first_env({"TORCHELASTIC_USE_AGENT_STORE"}) == "True";
    // The launcher's store outlives a restart of the workers, so each
    // attempt keeps to keys of its own, as torch's env:// does under
    // torchrun: "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/".
    std::string prefix;
    if (launcher_serves) {
      std::string attempt = first_env({"TORCHELASTIC_RESTART_COUNT"});
      prefix = absl::StrCat("/worker/attempt_", attempt.empty() ? "0" : attempt);
    }
    return open_tcp_store(absl::StrCat(addr, ":", port), rank, timeout,
                          launcher_serves, prefix);
  }
  if (absl::StartsWith(init_method, kFileScheme)) {
    std::string path(init_method.substr(sizeof(kFileScheme) - 1));
    if (path.empty()) {
      return absl::InvalidArgumentError(
          "init method 'file://' needs a path, e.g. 'file:///tmp/rdzv'");
    }
    try {
      return share(c10::make_intrusive<c10d::FileStore>(path, world_size));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "cannot open the rendezvous file '", path, "': ", e.what()));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported init method '", init_method,
                   "'; expected env://, tcp://HOST:PORT, file://PATH or "
                   "memory://KEY"));
}

}  // namespace

std::string rendezvous_host(absl::string_view init_method) {
  std::string host;
  if (absl::StartsWith(init_method, kEnvScheme)) {
    host = first_env({"MASTER_ADDR"});
  } else if (absl::StartsWith(init_method, kTcpScheme)) {
    absl::string_view host_port = init_method.substr(sizeof(kTcpScheme) - 1);
    const size_t colon = host_port.rfind(':');
    if (colon != absl::string_view::npos) host_port = host_port.substr(0, colon);
    host = std::string(host_port);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

namespace {

// What "tether/world_size" holds in a dynamic group (the store's keys are
// listed in core/join/membership.h).
constexpr char kDynamicMark[] = "dynamic";

absl::Status mixed_group(absl::string_view init_method, absl::string_view name,
                         int rank, int world_size) {
  // The peer's text first (its tests match it), then who and where.
  return absl::FailedPreconditionError(absl::StrCat(
      "RPC group mixes statically and dynamically initialized members which "
      "is not supported. Rank ",
      rank, " ('", name, "') cannot join the group at '", init_method,
      "' (this worker gave ",
      world_size == kDynamicGroup ? "no world size"
                                  : absl::StrCat("world size ", world_size),
      ", the group's first worker ",
      world_size == kDynamicGroup ? "a world size" : "none", ")"));
}

}  // namespace

absl::Status validate_worker_name(absl::string_view name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker name '", name, "' must have 1 to 128 characters"));
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker name '", name,
                       "' may only contain letters, digits, '_', '-', '.'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> env_rank() {
  std::string value =
      first_env({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"});
  int rank = -1;
  if (value.empty() || !absl::SimpleAtoi(value, &rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no rank given and none in RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK",
        value.empty() ? "" : absl::StrCat(" (got '", value, "')")));
  }
  return rank;
}

absl::StatusOr<int> env_world_size() {
  std::string value =
      first_env({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"});
  int world_size = -1;
  if (value.empty() || !absl::SimpleAtoi(value, &world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no world size given and none in WORLD_SIZE, SLURM_NTASKS or "
        "OMPI_COMM_WORLD_SIZE",
        value.empty() ? "" : absl::StrCat(" (got '", value, "')")));
  }
  return world_size;
}

absl::StatusOr<LauncherEnv> launcher_env() {
  LauncherEnv env;
  absl::StatusOr<int> rank = env_rank();
  if (!rank.ok()) return rank.status();
  absl::StatusOr<int> world_size = env_world_size();
  if (!world_size.ok()) return world_size.status();
  env.rank = *rank;
  env.world_size = *world_size;
  std::string local = first_env(
      {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"});
  if (!local.empty() && !absl::SimpleAtoi(local, &env.local_rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the launcher's local rank '", local, "' is not a number"));
  }
  return env;
}

namespace {

absl::StatusOr<RendezvousResult> rendezvous_dynamic(
    absl::string_view init_method, absl::string_view name, int rank,
    absl::Duration timeout) {
  if (rank < 0) {
    absl::StatusOr<int> from_env = env_rank();
    if (!from_env.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a worker joining a dynamic group needs its rank: ",
          from_env.status().message()));
    }
    rank = *from_env;
  }
  if (absl::Status valid = validate_worker_name(name); !valid.ok()) {
    return valid;
  }
  // Ranks are worker ids, 16 bits in autograd context and RRef ids.
  if (rank >= (1 << 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range [0, 65536)"));
  }
  // A FileStore deletes its file once `world_size` workers have closed it:
  // never, for a group whose size is not known.
  absl::StatusOr<std::shared_ptr<c10d::Store>> store = open_store(
      init_method, rank, std::numeric_limits<int>::max(), timeout);
  if (!store.ok()) return store.status();
  RendezvousResult result;
  result.group_key = std::string(init_method);
  result.host = rendezvous_host(init_method);
  result.store = *store;
  result.self = WorkerInfo{std::string(name), rank};
  result.dynamic = true;
  try {
    std::string holder = from_bytes((*store)->compareSet(
        "tether/world_size", {}, to_bytes(kDynamicMark)));
    if (holder != kDynamicMark) {
      return mixed_group(init_method, name, rank, kDynamicGroup);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous store at '", init_method, "': ", e.what()));
  }
  return result;
}

}  // namespace

absl::StatusOr<RendezvousResult> rendezvous(absl::string_view init_method,
                                            absl::string_view name, int rank,
                                            int world_size,
                                            absl::Duration timeout) {
  if (world_size == kDynamicGroup) {
    return rendezvous_dynamic(init_method, name, rank, timeout);
  }
  if (rank < 0) {
    absl::StatusOr<int> from_env = env_rank();
    if (!from_env.ok()) return from_env.status();
    rank = *from_env;
  }
  if (world_size < 0) {
    absl::StatusOr<int> from_env = env_world_size();
    if (!from_env.ok()) return from_env.status();
    world_size = *from_env;
  }
  if (absl::Status valid = validate_worker_name(name); !valid.ok()) {
    return valid;
  }
  if (world_size < 1 || world_size > (1 << 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", world_size, " is out of range [1, 65536]"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is out of range [0, ", world_size, ")"));
  }
  absl::StatusOr<std::shared_ptr<c10d::Store>> store =
      open_store(init_method, rank, world_size, timeout);
  if (!store.ok()) return store.status();

  RendezvousResult result;
  result.group_key = std::string(init_method);
  result.host = rendezvous_host(init_method);
  result.store = *store;
  c10d::Store& s = **store;
  try {
    const std::string rank_str = absl::StrCat(rank);
    // A group that cannot form fails every rank at once: the rank that finds
    // out why publishes it, and every rank polls for it while it waits.
    const std::string failed_key = "tether/failed";
    const std::string settled_key = "tether/settled";
    const absl::Time init_deadline = absl::Now() + timeout;
    // Every rank counts itself out; rank 0, whose process serves the store
    // for env:// and tcp://, goes last (within the init timeout), so that
    // the others read the reason rather than a lost store.
    auto leave_failed = [&](absl::Status why) {
      s.add("tether/failed_seen", 1);
      absl::Duration pause = absl::Milliseconds(1);
      while (rank == 0 && s.add("tether/failed_seen", 0) < world_size &&
             absl::Now() < init_deadline) {
        absl::SleepFor(pause);
        pause = std::min(pause * 2, absl::Milliseconds(50));
      }
      return why;
    };
    auto refuse = [&](absl::Status why) {
      const std::string text = absl::StrCat(
          "rank ", rank, " ('", name, "') cannot join the group: ",
          why.message());
      s.compareSet(failed_key, {},
                   to_bytes(absl::StrCat(static_cast<int>(why.code()), ":",
                                         text)));
      s.set(settled_key, to_bytes("failed"));
      return leave_failed(absl::Status(why.code(), text));
    };
    // compareSet with an empty expected value claims a key that is absent
    // and otherwise returns its holder.
    std::string size_holder = from_bytes(s.compareSet(
        "tether/world_size", {}, to_bytes(absl::StrCat(world_size))));
    if (size_holder == kDynamicMark) {
      // Not published as the group's failure: the dynamic group runs on.
      return mixed_group(init_method, name, rank, world_size);
    }
    if (size_holder != absl::StrCat(world_size)) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat("its world size is ", world_size,
                       " but the group's first rank started with ",
                       size_holder)));
    }
    std::string name_holder = from_bytes(s.compareSet(
        absl::StrCat("tether/name/", name), {}, to_bytes(rank_str)));
    if (name_holder != rank_str) {
      return refuse(absl::AlreadyExistsError(absl::StrCat(
          "worker name '", name, "' is already taken by rank ", name_holder,
          ": a worker's name is not unique")));
    }
    std::string rank_holder = from_bytes(s.compareSet(
        absl::StrCat("tether/rank/", rank), {}, to_bytes(name)));
    if (rank_holder != name) {
      return refuse(absl::AlreadyExistsError(absl::StrCat(
          "rank ", rank, " is already taken by worker '", rank_holder, "'")));
    }
    std::vector<std::string> keys;
    for (int r = 0; r < world_size; ++r) {
      keys.push_back(absl::StrCat("tether/rank/", r));
    }
    // The rank that completes the group, or one that refuses it, sets
    // `settled_key`; every rank waits for that one key, woken by its arrival
    // (core/toolkit/store_wait.h), then reads why. The store serves requests in
    // order, so the rank whose claim lands last sees every claim here.
    if (s.check(keys)) s.set(settled_key, to_bytes("all"));
    const absl::Time deadline = init_deadline;
    const bool settled =
        internal::wait_for_keys(s, {settled_key}, deadline);
    if (!settled || !s.check(keys)) {
      if (settled && s.check({failed_key})) {
        const std::string failed = from_bytes(s.get(failed_key));
        const size_t colon = failed.find(':');
        int code = 0;
        if (colon == std::string::npos ||
            !absl::SimpleAtoi(failed.substr(0, colon), &code) || code <= 0 ||
            code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
          code = static_cast<int>(absl::StatusCode::kFailedPrecondition);
        }
        return leave_failed(absl::Status(
            static_cast<absl::StatusCode>(code),
            absl::StrCat("the group at '", init_method, "' cannot form: ",
                         colon == std::string::npos
                             ? failed
                             : failed.substr(colon + 1))));
      }
      std::vector<std::string> missing;
      for (int r = 0; r < world_size; ++r) {
        if (!s.check({keys[r]})) missing.push_back(absl::StrCat(r));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous at '", init_method, "' timed out after ",
          absl::FormatDuration(timeout), " waiting for rank(s) ",
          absl::StrJoin(missing, ", ")));
    }
    for (int r = 0; r < world_size; ++r) {
      result.workers.push_back(WorkerInfo{from_bytes(s.get(keys[r])), r});
    }
    result.self = result.workers[rank];
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous store at '", init_method, "': ", e.what()));
  }
  return result;
}

}  // namespace tether
