#include "backends/tensorpipe/internal/cma_write_channel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <tensorpipe/channel/channel.h>
#include <tensorpipe/common/buffer.h>
#include <tensorpipe/common/cpu_buffer.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/context.h>
#include <tensorpipe/transport/listener.h>
#include <tensorpipe/transport/uv/factory.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace tether::backends::tensorpipe::internal {
namespace {

namespace tp = ::tensorpipe;
using ::testing::HasSubstr;

constexpr auto kBound = std::chrono::seconds(30);

// Two connected transport connections on loopback (TensorPipe's uv: the
// channel does not care what carries its notes).
struct Wire {
  std::shared_ptr<tp::transport::Context> context = tp::transport::uv::create();
  std::shared_ptr<tp::transport::Listener> listener;
  std::shared_ptr<tp::transport::Connection> near;
  std::shared_ptr<tp::transport::Connection> far;

  // Sends `bytes` from the far end, as a peer's channel would.
  void from_far(std::array<char, kCmaWriteNoteBytes> bytes) {
    auto owned = std::make_shared<std::array<char, kCmaWriteNoteBytes>>(bytes);
    far->write(owned->data(), owned->size(), [owned](const tp::Error&) {});
  }

  Wire() {
    listener = context->listen("127.0.0.1");
    std::promise<std::shared_ptr<tp::transport::Connection>> accepted;
    listener->accept([&](const tp::Error& error,
                         std::shared_ptr<tp::transport::Connection> c) {
      accepted.set_value(error ? nullptr : std::move(c));
    });
    near = context->connect(listener->addr());
    far = accepted.get_future().get();
  }
  ~Wire() {
    context->close();
    context->join();
  }
};

// A callback's error, once it came.
struct Outcome {
  std::promise<std::string> promise;
  std::future<std::string> future = promise.get_future();
  std::function<void(const tp::Error&)> callback() {
    return [this](const tp::Error& error) {
      promise.set_value(error ? error.what() : "");
    };
  }
  std::string get() {
    if (future.wait_for(kBound) != std::future_status::ready) {
      return "(no callback)";
    }
    return future.get();
  }
};

// The first 4 bytes of a note are its kind, then the value (i32), the
// tensor's number, the address and the length (u64 each).
std::array<char, kCmaWriteNoteBytes> note(uint32_t kind, int32_t value,
                                          uint64_t sequence, uint64_t address,
                                          uint64_t length) {
  std::array<char, kCmaWriteNoteBytes> bytes{};
  std::memcpy(bytes.data(), &kind, 4);
  std::memcpy(bytes.data() + 4, &value, 4);
  std::memcpy(bytes.data() + 8, &sequence, 8);
  std::memcpy(bytes.data() + 16, &address, 8);
  std::memcpy(bytes.data() + 24, &length, 8);
  return bytes;
}
constexpr uint32_t kGrant = 0x544e5247;
constexpr uint32_t kDone = 0x454e4f44;

class CmaWriteChannel : public ::testing::Test {
 protected:
  void SetUp() override {
    context_ = create_cma_write_channel();
    if (!context_->isViable()) {
      GTEST_SKIP() << "cross-memory copies are not allowed here";
    }
  }
  void TearDown() override {
    if (context_ != nullptr) {
      context_->close();
      context_->join();
    }
  }

  std::shared_ptr<tp::channel::Context> context_;
};

TEST_F(CmaWriteChannel, MovesTensorsBetweenTwoChannels) {
  Wire wire;
  auto other = create_cma_write_channel();
  auto sender = context_->createChannel({wire.near}, tp::channel::Endpoint::kConnect);
  auto receiver = other->createChannel({wire.far}, tp::channel::Endpoint::kListen);
  std::vector<std::vector<char>> sources;
  std::vector<std::vector<char>> destinations;
  for (size_t size : {size_t{1}, size_t{4096}, size_t{3} << 20}) {
    sources.emplace_back(size, static_cast<char>('a' + sources.size()));
    destinations.emplace_back(size, 0);
  }
  std::vector<std::unique_ptr<Outcome>> sent;
  std::vector<std::unique_ptr<Outcome>> received;
  for (size_t i = 0; i < sources.size(); ++i) {
    sent.push_back(std::make_unique<Outcome>());
    received.push_back(std::make_unique<Outcome>());
    sender->send(tp::CpuBuffer{sources[i].data()}, sources[i].size(),
                 sent.back()->callback());
    receiver->recv(tp::CpuBuffer{destinations[i].data()},
                   destinations[i].size(), received.back()->callback());
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    EXPECT_EQ(sent[i]->get(), "") << i;
    EXPECT_EQ(received[i]->get(), "") << i;
    EXPECT_EQ(destinations[i], sources[i]) << i;
  }
  sender->close();
  receiver->close();
  other->close();
  other->join();
}

// The peer's side is raw bytes on the connection: what a broken or hostile
// peer could send.
TEST_F(CmaWriteChannel, ANoteOfUnknownKindFailsTheChannelNamingIt) {
  Wire wire;
  auto channel = context_->createChannel({wire.near}, tp::channel::Endpoint::kConnect);
  std::vector<char> destination(64);
  Outcome received;
  channel->recv(tp::CpuBuffer{destination.data()}, destination.size(),
                received.callback());
  wire.from_far(note(0x41414141, 0, 0, 0, 0));
  EXPECT_THAT(received.get(), HasSubstr("a note of unknown kind 1094795585"));
}

TEST_F(CmaWriteChannel, AGrantOfAnotherLengthFailsTheSendNamingBoth) {
  Wire wire;
  auto channel = context_->createChannel({wire.near}, tp::channel::Endpoint::kConnect);
  std::vector<char> source(100, 'x');
  std::vector<char> elsewhere(1000, 0);
  Outcome sent;
  channel->send(tp::CpuBuffer{source.data()}, source.size(), sent.callback());
  wire.from_far(note(kGrant, ::getpid(), 0,
                    reinterpret_cast<uint64_t>(elsewhere.data()), 1000));
  EXPECT_THAT(sent.get(),
              HasSubstr("a grant for tensor 0 of 1000 bytes where tensor 0 "
                        "of 100 bytes was next"));
  EXPECT_EQ(elsewhere, std::vector<char>(1000, 0));  // nothing written
}

TEST_F(CmaWriteChannel, ADoneNoteForNothingGrantedFailsTheChannel) {
  Wire wire;
  auto channel = context_->createChannel({wire.near}, tp::channel::Endpoint::kConnect);
  std::vector<char> source(10, 'x');
  Outcome sent;
  // A send waits for its grant; the done note that comes instead is for a
  // receive this side never granted.
  channel->send(tp::CpuBuffer{source.data()}, source.size(), sent.callback());
  wire.from_far(note(kDone, 0, 7, 0, 0));
  EXPECT_THAT(sent.get(),
              HasSubstr("a done note for tensor 7 where none was granted"));
}

// A write the kernel refuses (the grant names memory the receiver does not
// have) fails the send, and the receiver is told why.
TEST_F(CmaWriteChannel, AFailedWriteFailsBothSidesNamingTheCall) {
  Wire wire;
  auto channel = context_->createChannel({wire.near}, tp::channel::Endpoint::kConnect);
  std::vector<char> source(4096, 'x');
  Outcome sent;
  channel->send(tp::CpuBuffer{source.data()}, source.size(), sent.callback());
  wire.from_far(note(kGrant, ::getpid(), 0, /*address=*/8, source.size()));
  EXPECT_THAT(sent.get(), HasSubstr("process_vm_writev"));
  // The done note with the errno reached the peer.
  std::promise<std::string> told;
  std::array<char, kCmaWriteNoteBytes> in{};
  wire.far->read(in.data(), in.size(),
                 [&](const tp::Error& error, const void*, size_t) {
                   told.set_value(error ? error.what() : "");
                 });
  auto heard = told.get_future();
  ASSERT_EQ(heard.wait_for(kBound), std::future_status::ready);
  ASSERT_EQ(heard.get(), "");
  uint32_t kind = 0;
  int32_t value = 0;
  std::memcpy(&kind, in.data(), 4);
  std::memcpy(&value, in.data() + 4, 4);
  EXPECT_EQ(kind, kDone);
  EXPECT_NE(value, 0);
}

}  // namespace
}  // namespace tether::backends::tensorpipe::internal
