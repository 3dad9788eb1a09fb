#include "backends/grpc/internal/receive_pool.h"

#include <c10/core/Storage.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace tether::backends::grpc_internal {
namespace {

constexpr size_t kMin = 64 << 10;

c10::Storage storage_from(ReceivePool& pool, size_t bytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes, &pool,
                      /*resizable=*/false);
}

TEST(ReceivePool, FreedBlockIsReusedForTheSameSize) {
  ReceivePool pool(kMin, 8 << 20);
  const void* first = nullptr;
  {
    c10::Storage storage = storage_from(pool, 1 << 20);
    first = storage.data();
    std::memset(storage.data(), 7, storage.nbytes());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  }
  EXPECT_EQ(pool.cached_bytes(), size_t{1} << 20);
  c10::Storage again = storage_from(pool, 1 << 20);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  // Another size does not take it.
  c10::Storage other = storage_from(pool, (1 << 20) + 8192);
  EXPECT_NE(other.data(), first);
}

TEST(ReceivePool, SmallStoragesAreNotPooled) {
  ReceivePool pool(kMin, 8 << 20);
  { c10::Storage storage = storage_from(pool, kMin - 1); }
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST(ReceivePool, KeepsAtMostItsLimit) {
  ReceivePool pool(kMin, 3 << 20);
  {
    c10::Storage a = storage_from(pool, 2 << 20);
    c10::Storage b = storage_from(pool, 2 << 20);
  }
  EXPECT_EQ(pool.cached_bytes(), size_t{2} << 20);
}

TEST(ReceivePool, TheProcessPoolOutlivesItsStorages) {
  c10::Storage storage = storage_from(ReceivePool::get(), 1 << 20);
  EXPECT_EQ(storage.nbytes(), size_t{1} << 20);
}

}  // namespace
}  // namespace tether::backends::grpc_internal
