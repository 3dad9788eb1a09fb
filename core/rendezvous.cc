#include "core/rendezvous.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <exception>

namespace tether {
namespace {

constexpr char kMemoryScheme[] = "memory://";

std::vector<uint8_t> to_bytes(absl::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string from_bytes(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

absl::StatusOr<std::shared_ptr<c10d::Store>> open_store(
    absl::string_view init_method) {
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
    // c10d stores are intrusive_ptr; hold a reference inside the shared_ptr.
    c10::intrusive_ptr<c10d::HashStore> ref = store;
    return std::shared_ptr<c10d::Store>(ref.get(), [ref](c10d::Store*) {});
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported init method '", init_method, "'; expected memory://KEY"));
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

absl::StatusOr<RendezvousResult> rendezvous(absl::string_view init_method,
                                            absl::string_view name, int rank,
                                            int world_size,
                                            absl::Duration timeout) {
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
  absl::StatusOr<std::shared_ptr<c10d::Store>> store = open_store(init_method);
  if (!store.ok()) return store.status();

  RendezvousResult result;
  result.group_key = std::string(init_method);
  result.store = *store;
  c10d::Store& s = **store;
  try {
    const std::string rank_str = absl::StrCat(rank);
    // compareSet with an empty expected value claims a key that is absent
    // and otherwise returns its holder.
    std::string name_holder = from_bytes(s.compareSet(
        absl::StrCat("tether/name/", name), {}, to_bytes(rank_str)));
    if (name_holder != rank_str) {
      return absl::AlreadyExistsError(
          absl::StrCat("worker name '", name, "' is already taken by rank ",
                       name_holder));
    }
    std::string rank_holder = from_bytes(s.compareSet(
        absl::StrCat("tether/rank/", rank), {}, to_bytes(name)));
    if (rank_holder != name) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", rank, " is already taken by worker '", rank_holder, "'"));
    }
    std::vector<std::string> keys;
    for (int r = 0; r < world_size; ++r) {
      keys.push_back(absl::StrCat("tether/rank/", r));
    }
    try {
      s.wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    } catch (const std::exception&) {
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
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous store at '", init_method, "': ", e.what()));
  }
  return result;
}

}  // namespace tether
