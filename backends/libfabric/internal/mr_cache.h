// MrCache: the registrations of the storages a libfabric agent lends to its
// peers by rendezvous (internal to the libfabric backend).
//
// Registering memory (fi_mr_reg) costs a system call and, on RDMA hardware,
// pinning pages; a model sends the same parameter storages again and again.
// The cache keeps a storage's registration after its transfer ends, keyed by
// (storage, data pointer, size, access), and hands it out again on the next
// send. An idle entry whose storage nobody else holds any more is evicted at
// once (it can never be sent again); other idle entries least recently used
// first, when there are more than `max_entries` entries or more than
// `max_bytes` registered.
//
// WARNING: an entry holds a reference to its storage, so that the memory
// cannot be freed and reused under a registration (the classic
// registration-cache bug, which would corrupt data on pinned RDMA memory).
// The cost is that a storage the application drops after its last send
// stays allocated until the next drop_unheld(); `max_entries` = 0 turns
// caching off.
//
// Ownership: the cache borrows the Fabric, which outlives it. Every Handle
// must be destroyed before the cache.
//
// Thread safety: none; the agent's progress thread alone uses it.
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_MR_CACHE_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_MR_CACHE_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/statusor.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <tuple>

#include "backends/libfabric/internal/fabric.h"

namespace tether::backends::libfabric::internal {

class MrCache {
  struct Entry;

 public:
  struct Limits {
    size_t max_entries = 64;
    uint64_t max_bytes = uint64_t{256} << 20;
  };

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
    size_t entries = 0;
    uint64_t bytes = 0;
  };

  // A registration in use; releases it when destroyed. Move-only.
  class Handle {
   public:
    Handle() = default;
    Handle(Handle&& other) noexcept;
    Handle& operator=(Handle&& other) noexcept;
    ~Handle();

    const MemoryRegion& region() const;

   private:
    friend class MrCache;
    Handle(MrCache* cache, Entry* entry) : cache_(cache), entry_(entry) {}
    void reset();

    MrCache* cache_ = nullptr;
    Entry* entry_ = nullptr;
  };

  MrCache(Fabric* fabric, Limits limits);
  ~MrCache();
  MrCache(const MrCache&) = delete;
  MrCache& operator=(const MrCache&) = delete;

  // The registration of `storage`'s bytes (not empty) with `access`, cached
  // or new. UNAVAILABLE when libfabric refuses to register.
  [[nodiscard]] absl::StatusOr<Handle> acquire(const c10::Storage& storage,
                                               uint64_t access);

  // Evicts the idle entries whose storage nobody else holds any more
  // (release() does it too; the agent also calls it now and then).
  void drop_unheld();

  Stats stats() const;

 private:
  using Key = std::tuple<const void*, const void*, size_t, uint64_t>;

  struct Entry {
    Key key;
    c10::Storage storage;
    std::unique_ptr<MemoryRegion> region;
    int references = 0;
    bool idle = false;
    std::list<Entry*>::iterator idle_position;
  };

  void release(Entry* entry);
  // Closes idle entries, least recently used first, while over the limits.
  void evict();

  Fabric* const fabric_;
  const Limits limits_;
  absl::flat_hash_map<Key, std::unique_ptr<Entry>> entries_;
  // Idle entries, least recently used first.
  std::list<Entry*> idle_;
  uint64_t bytes_ = 0;
  Stats stats_;
};

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_MR_CACHE_H_
