#include "core/toolkit/receive_buffers.h"

#include <gtest/gtest.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace tether::internal {
namespace {

TEST(ReceiveBuffers, SmallStoragesAreOrdinary) {
  const ReceiveBufferStats before = receive_buffer_stats();
  c10::Storage storage = receive_storage(1024);
  EXPECT_EQ(storage.nbytes(), 1024u);
  EXPECT_FALSE(storage.resizable());
  std::memset(storage.data(), 7, 1024);
  const ReceiveBufferStats after = receive_buffer_stats();
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.reused, before.reused);
}

TEST(ReceiveBuffers, WritableStoragesOfAnySizeComeFromTheCache) {
  const ReceiveBufferStats start = receive_buffer_stats();
  void* data = nullptr;
  {
    c10::Storage storage = writable_receive_storage(300 << 10);
    ASSERT_EQ(storage.nbytes(), size_t{300} << 10);
    data = storage.data();
    std::memset(data, 3, storage.nbytes());
  }
  c10::Storage again = writable_receive_storage(300 << 10);
  EXPECT_EQ(again.data(), data);
  EXPECT_EQ(receive_buffer_stats().reused, start.reused + 1);
}

// What a writer granted the buffer of a receive that then failed would do:
// its late write fails instead of landing in memory in use.
TEST(ReceiveBuffers, AQuarantinedBufferIsNeverWrittenOrReusedAgain) {
  const ReceiveBufferStats start = receive_buffer_stats();
  const size_t size = (300 << 10) + 5;
  void* data = nullptr;
  {
    c10::Storage storage = writable_receive_storage(size);
    data = storage.data();
    std::memset(data, 1, size);
    quarantine_receive_storage(storage);
  }
  EXPECT_EQ(receive_buffer_stats().quarantined, start.quarantined + 1);
  char bytes[64] = {};
  for (size_t offset : {size_t{0}, size - sizeof bytes}) {
    iovec local{bytes, sizeof bytes};
    iovec remote{static_cast<char*>(data) + offset, sizeof bytes};
    errno = 0;
    EXPECT_EQ(::process_vm_writev(::getpid(), &local, 1, &remote, 1, 0), -1)
        << "offset " << offset;
    EXPECT_EQ(errno, EFAULT);
  }
  c10::Storage next = writable_receive_storage(size);
  EXPECT_NE(next.data(), data);
}

TEST(ReceiveBuffers, QuarantineLeavesOtherStoragesAlone) {
  const ReceiveBufferStats start = receive_buffer_stats();
  {
    c10::Storage small = receive_storage(1024);
    quarantine_receive_storage(small);
  }
  EXPECT_EQ(receive_buffer_stats().quarantined, start.quarantined);
}

TEST(ReceiveBuffers, ALargeBufferComesBackOnceDropped) {
  drop_idle_receive_buffers();
  const size_t size = kReusedBufferBytes + 4096;
  const ReceiveBufferStats start = receive_buffer_stats();
  void* first_data = nullptr;
  {
    c10::Storage first = receive_storage(size);
    ASSERT_EQ(first.nbytes(), size);
    first_data = first.data();
    std::memset(first_data, 1, size);
    // While in use, a second storage of that size is another buffer.
    c10::Storage second = receive_storage(size);
    EXPECT_NE(second.data(), first_data);
  }
  EXPECT_EQ(receive_buffer_stats().allocated, start.allocated + 2);
  EXPECT_EQ(receive_buffer_stats().idle_bytes, 2 * size);
  c10::Storage again = receive_storage(size);
  EXPECT_EQ(receive_buffer_stats().reused, start.reused + 1);
  EXPECT_EQ(receive_buffer_stats().idle_bytes, size);
  // Another size is not served from it.
  c10::Storage other = receive_storage(size + 4096);
  EXPECT_EQ(receive_buffer_stats().allocated, start.allocated + 3);
  drop_idle_receive_buffers();
  EXPECT_EQ(receive_buffer_stats().idle_bytes, 0u);
}

TEST(ReceiveBuffers, TheCacheStaysBounded) {
  drop_idle_receive_buffers();
  const size_t size = kReceiveCacheBytes / 3 + 1;
  {
    std::vector<c10::Storage> held;
    for (int i = 0; i < 4; ++i) held.push_back(receive_storage(size));
  }
  EXPECT_LE(receive_buffer_stats().idle_bytes, kReceiveCacheBytes);
  EXPECT_GT(receive_buffer_stats().idle_bytes, 0u);
  drop_idle_receive_buffers();
}

TEST(ReceiveBuffers, StoragesMayBeReleasedOnAnyThread) {
  drop_idle_receive_buffers();
  c10::Storage storage = receive_storage(kReusedBufferBytes);
  std::thread([moved = std::move(storage)]() mutable {
    moved = c10::Storage();
  }).join();
  EXPECT_EQ(receive_buffer_stats().idle_bytes, kReusedBufferBytes);
  drop_idle_receive_buffers();
}

}  // namespace
}  // namespace tether::internal
