#include "backends/libfabric/internal/mr_cache.h"

#include "core/toolkit/check.h"

namespace tether::backends::libfabric::internal {

MrCache::Handle::Handle(Handle&& other) noexcept
    : cache_(other.cache_), entry_(other.entry_) {
  other.cache_ = nullptr;
  other.entry_ = nullptr;
}

MrCache::Handle& MrCache::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    cache_ = other.cache_;
    entry_ = other.entry_;
    other.cache_ = nullptr;
    other.entry_ = nullptr;
  }
  return *this;
}

MrCache::Handle::~Handle() { reset(); }

const MemoryRegion& MrCache::Handle::region() const {
  TETHER_CHECK(entry_ != nullptr, "region() of an empty MrCache::Handle");
  return *entry_->region;
}

void MrCache::Handle::reset() {
  if (entry_ != nullptr) cache_->release(entry_);
  cache_ = nullptr;
  entry_ = nullptr;
}

MrCache::MrCache(Fabric* fabric, Limits limits)
    : fabric_(fabric), limits_(limits) {}

MrCache::~MrCache() {
  for (const auto& [key, entry] : entries_) {
    TETHER_CHECK(entry->references == 0,
                 "MrCache destroyed while a registration is in use");
  }
}

absl::StatusOr<MrCache::Handle> MrCache::acquire(const c10::Storage& storage,
                                                 uint64_t access) {
  const Key key{storage.unsafeGetStorageImpl(), storage.data(),
                storage.nbytes(), access};
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    Entry* entry = it->second.get();
    if (entry->idle) {
      idle_.erase(entry->idle_position);
      entry->idle = false;
    }
    ++entry->references;
    ++stats_.hits;
    return Handle(this, entry);
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region =
      fabric_->register_memory(storage.data(), storage.nbytes(), access);
  if (!region.ok()) return region.status();
  auto entry = std::make_unique<Entry>();
  entry->key = key;
  entry->storage = storage;
  entry->region = *std::move(region);
  entry->references = 1;
  Entry* raw = entry.get();
  entries_.emplace(key, std::move(entry));
  bytes_ += storage.nbytes();
  ++stats_.misses;
  return Handle(this, raw);
}

void MrCache::release(Entry* entry) {
  TETHER_CHECK(entry->references > 0, "MrCache entry released twice");
  if (--entry->references > 0) return;
  entry->idle = true;
  entry->idle_position = idle_.insert(idle_.end(), entry);
  evict();
}

void MrCache::evict() {
  drop_unheld();
  while (!idle_.empty() &&
         (entries_.size() > limits_.max_entries || bytes_ > limits_.max_bytes)) {
    Entry* victim = idle_.front();
    idle_.pop_front();
    bytes_ -= victim->storage.nbytes();
    ++stats_.evictions;
    // Closes the registration, then drops the storage.
    entries_.erase(victim->key);
  }
}

void MrCache::drop_unheld() {
  // A storage only the cache holds can never be sent again: its entry goes,
  // and its memory back to the allocator.
  for (auto it = idle_.begin(); it != idle_.end();) {
    Entry* entry = *it;
    if (entry->storage.use_count() > 1) {
      ++it;
      continue;
    }
    it = idle_.erase(it);
    bytes_ -= entry->storage.nbytes();
    ++stats_.evictions;
    entries_.erase(entry->key);
  }
}

MrCache::Stats MrCache::stats() const {
  Stats stats = stats_;
  stats.entries = entries_.size();
  stats.bytes = bytes_;
  return stats;
}

}  // namespace tether::backends::libfabric::internal
