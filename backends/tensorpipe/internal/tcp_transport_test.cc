// tether's tcp transport on its own (no pipe, no agent): how it sends what
// TensorPipe writes. Two contexts in this process, a connection between
// them over loopback.
#include "backends/tensorpipe/internal/tcp_transport.h"

#include <absl/strings/string_view.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/context.h>
#include <tensorpipe/transport/listener.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tether::backends::tensorpipe::internal {
namespace {

namespace tpt = ::tensorpipe::transport;

constexpr auto kBound = std::chrono::seconds(30);
// TCP_ESTABLISHED (<netinet/tcp.h>, which clashes with <linux/tcp.h>,
// whose tcp_info has the data segments).
constexpr uint8_t kEstablished = 1;

std::shared_ptr<tpt::Context> transport_of(const std::string& self,
                                           ExpressSink sink = nullptr) {
  TcpTransportOptions options;
  options.self = self;
  options.members = {"client", "server"};
  options.express_sink = std::move(sink);
  return create_tcp_transport(options);
}

// What a context's express sink received, in order.
class ExpressInbox {
 public:
  ExpressSink sink() {
    return [this](const std::shared_ptr<tcp::ConnectionImpl>& connection,
                  absl::string_view frame) {
      std::lock_guard<std::mutex> lock(mu_);
      frames_.emplace_back(frame);
      peers_.push_back(express_peer(*connection));
      last_ = connection;
      cv_.notify_all();
    };
  }
  // The first `count` frames, once they are all there (fewer after kBound).
  std::vector<std::string> wait_for(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kBound, [&] { return frames_.size() >= count; });
    return frames_;
  }
  std::vector<std::string> peers() {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_;
  }
  std::shared_ptr<tcp::ConnectionImpl> last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> frames_;
  std::vector<std::string> peers_;
  std::shared_ptr<tcp::ConnectionImpl> last_;
};

// The port of a socket address, or -1.
int port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return -1;
}

// The established TCP socket of this process whose local port is `port`
// (the accepted end of the one connection to a listener), or -1.
int accepted_socket(int port) {
  int found = -1;
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) return -1;
  while (const dirent* entry = ::readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    if (fd <= 2) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
        port_of(local) != port) {
      continue;
    }
    tcp_info info{};
    socklen_t size = sizeof(info);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) == 0 &&
        info.tcpi_state == kEstablished) {
      found = fd;
    }
  }
  ::closedir(fds);
  return found;
}

// The data segments `fd` has sent.
uint32_t data_segments_out(int fd) {
  tcp_info info{};
  socklen_t size = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0) return 0;
  return info.tcpi_data_segs_out;
}

// A client and a server context, a listener, and one connection between
// them: `client` connects, `server` is what the listener accepted.
class Connected : public ::testing::Test {
 protected:
  void SetUp() override {
    server_context_ = transport_of("server", server_sink_);
    client_context_ = transport_of("client", client_inbox_.sink());
    ASSERT_NE(server_context_, nullptr);
    ASSERT_NE(client_context_, nullptr);
    listener_ = server_context_->listen("127.0.0.1");
    std::promise<std::shared_ptr<tpt::Connection>> accepted;
    listener_->accept([&accepted](const ::tensorpipe::Error& error,
                                  std::shared_ptr<tpt::Connection> connection) {
      accepted.set_value(error ? nullptr : std::move(connection));
    });
    {
      OpenedConnection opened;
      client_ = client_context_->connect(listener_->addr());
      client_impl_ = opened.take();
    }
    ASSERT_NE(client_impl_, nullptr);
    // The handshake ends before the listener hands the connection over;
    // a write makes the client run it.
    std::promise<bool> sent;
    const uint64_t hello = 42;
    client_->write(&hello, sizeof(hello),
                   [&sent](const ::tensorpipe::Error& error) {
                     sent.set_value(!error);
                   });
    auto accepted_future = accepted.get_future();
    ASSERT_EQ(accepted_future.wait_for(kBound), std::future_status::ready);
    server_ = accepted_future.get();
    ASSERT_NE(server_, nullptr);
    auto sent_future = sent.get_future();
    ASSERT_EQ(sent_future.wait_for(kBound), std::future_status::ready);
    ASSERT_TRUE(sent_future.get());
    uint64_t received = 0;
    ASSERT_TRUE(read_exactly(*server_, &received, sizeof(received)));
    ASSERT_EQ(received, hello);
    const std::string address = listener_->addr();
    server_fd_ = accepted_socket(std::stoi(address.substr(address.rfind(':') + 1)));
    ASSERT_GE(server_fd_, 0) << "no accepted socket on " << address;
  }

  void TearDown() override {
    if (client_ != nullptr) client_->close();
    if (server_ != nullptr) server_->close();
    if (listener_ != nullptr) listener_->close();
    for (const auto& context : {client_context_, server_context_}) {
      if (context == nullptr) continue;
      context->close();
      context->join();
    }
  }

  // Reads one frame of `length` bytes into `ptr`; false on error or after
  // kBound.
  static bool read_exactly(tpt::Connection& connection, void* ptr,
                           size_t length) {
    auto done = std::make_shared<std::promise<bool>>();
    auto result = done->get_future();
    connection.read(ptr, length,
                    [done](const ::tensorpipe::Error& error, const void*,
                           size_t) { done->set_value(!error); });
    return result.wait_for(kBound) == std::future_status::ready && result.get();
  }

  // Subclasses may set these before SetUp().
  ExpressSink server_sink_;
  ExpressInbox client_inbox_;
  std::shared_ptr<tcp::ConnectionImpl> client_impl_;
  std::shared_ptr<tpt::Context> server_context_;
  std::shared_ptr<tpt::Context> client_context_;
  std::shared_ptr<tpt::Listener> listener_;
  std::shared_ptr<tpt::Connection> client_;
  std::shared_ptr<tpt::Connection> server_;
  int server_fd_ = -1;
};

// Writes made in one turn of the loop (here, answers written by the read
// callback that received a request, as a handler running in the loop
// does) leave together in one sendmsg(): one data segment for 32 small
// frames, which arrive whole and in order. Sent one by one, they took 32.
TEST_F(Connected, WritesOfOneTurnOfTheLoopLeaveTogether) {
  constexpr int kFrames = 32;
  const uint32_t before = data_segments_out(server_fd_);
  std::vector<std::string> frames;
  for (int i = 0; i < kFrames; ++i) {
    frames.push_back("answer " + std::to_string(i) + std::string(8, '.'));
  }
  std::promise<int> written;
  auto count = std::make_shared<int>(0);
  uint64_t request = 0;
  server_->read(&request, sizeof(request),
                [this, &frames, &written, count](const ::tensorpipe::Error& error,
                                                 const void*, size_t) {
                  ASSERT_FALSE(error) << error.what();
                  for (const std::string& frame : frames) {
                    server_->write(frame.data(), frame.size(),
                                   [&written, count](const ::tensorpipe::Error& e) {
                                     if (e) {
                                       written.set_value(-1);
                                     } else if (++*count == kFrames) {
                                       written.set_value(*count);
                                     }
                                   });
                  }
                });
  const uint64_t go = 7;
  client_->write(&go, sizeof(go), [](const ::tensorpipe::Error&) {});

  std::mutex mu;
  std::vector<std::string> received;
  std::promise<void> all_read;
  for (int i = 0; i < kFrames; ++i) {
    client_->read([&, i](const ::tensorpipe::Error& error, const void* ptr,
                         size_t length) {
      std::lock_guard<std::mutex> lock(mu);
      received.push_back(error ? "error: " + error.what()
                               : std::string(static_cast<const char*>(ptr), length));
      if (i == kFrames - 1) all_read.set_value();
    });
  }
  auto all_read_future = all_read.get_future();
  ASSERT_EQ(all_read_future.wait_for(kBound), std::future_status::ready);
  auto written_future = written.get_future();
  ASSERT_EQ(written_future.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(written_future.get(), kFrames);
  EXPECT_EQ(received, frames);
  EXPECT_EQ(data_segments_out(server_fd_) - before, 1u);
}

// A frame larger than the sockets' buffers, written while the peer does not
// read, waits for room (EPOLLOUT); its callback runs once it is all sent,
// and the small frame written after it follows it whole.
TEST_F(Connected, AFrameLargerThanTheSocketWaitsForRoom) {
  const size_t kLarge = size_t{32} << 20;
  std::string large(kLarge, '\0');
  for (size_t i = 0; i < kLarge; i += 4096) large[i] = static_cast<char>(i >> 12);
  const std::string small = "after the large one";
  std::promise<bool> large_sent;
  std::promise<bool> small_sent;
  server_->write(large.data(), large.size(),
                 [&large_sent](const ::tensorpipe::Error& error) {
                   large_sent.set_value(!error);
                 });
  server_->write(small.data(), small.size(),
                 [&small_sent](const ::tensorpipe::Error& error) {
                   small_sent.set_value(!error);
                 });
  auto large_future = large_sent.get_future();
  // Nothing reads yet: the socket cannot take it all.
  EXPECT_EQ(large_future.wait_for(std::chrono::milliseconds(200)),
            std::future_status::timeout);
  std::string got(kLarge, 'x');
  ASSERT_TRUE(read_exactly(*client_, got.data(), got.size()));
  EXPECT_TRUE(got == large);
  std::string got_small(small.size(), 'x');
  ASSERT_TRUE(read_exactly(*client_, got_small.data(), got_small.size()));
  EXPECT_EQ(got_small, small);
  ASSERT_EQ(large_future.wait_for(kBound), std::future_status::ready);
  EXPECT_TRUE(large_future.get());
  auto small_future = small_sent.get_future();
  ASSERT_EQ(small_future.wait_for(kBound), std::future_status::ready);
  EXPECT_TRUE(small_future.get());
}

// A server whose sink answers every express frame with one of its own.
class ExpressEcho : public Connected {
 protected:
  void SetUp() override {
    server_sink_ = [this](const std::shared_ptr<tcp::ConnectionImpl>& connection,
                          absl::string_view frame) {
      server_inbox_sink_(connection, frame);
      write_express(connection, "echo " + std::string(frame));
    };
    Connected::SetUp();
  }

  ExpressInbox server_inbox_;
  ExpressSink server_inbox_sink_ = server_inbox_.sink();
};

// Express frames written between TensorPipe's frames reach the sink whole
// and in order, with the peer's name, and TensorPipe's frames (of known
// and unknown size) around them arrive intact; the sink's answers come
// back the same way.
TEST_F(ExpressEcho, ExpressFramesPassBetweenTensorPipesFrames) {
  const std::string first = "tensorpipe's first frame";
  const uint64_t second = 0x1122334455667788;
  const std::string large(100 << 10, 'L');  // a frame near the limit
  std::vector<std::string> express = {"one", std::string(1, '\0'), large,
                                      "four"};
  client_->write(first.data(), first.size(), [](const ::tensorpipe::Error&) {});
  write_express(client_impl_, express[0]);
  write_express(client_impl_, express[1]);
  client_->write(&second, sizeof(second), [](const ::tensorpipe::Error&) {});
  write_express(client_impl_, express[2]);
  write_express(client_impl_, express[3]);

  std::promise<std::string> got_first;
  server_->read([&got_first](const ::tensorpipe::Error& error, const void* ptr,
                             size_t length) {
    got_first.set_value(error ? "error: " + error.what()
                              : std::string(static_cast<const char*>(ptr),
                                            length));
  });
  auto first_future = got_first.get_future();
  ASSERT_EQ(first_future.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(first_future.get(), first);
  uint64_t got_second = 0;
  ASSERT_TRUE(read_exactly(*server_, &got_second, sizeof(got_second)));
  EXPECT_EQ(got_second, second);

  EXPECT_EQ(server_inbox_.wait_for(express.size()), express);
  EXPECT_EQ(server_inbox_.peers(),
            std::vector<std::string>(express.size(), "client"));
  std::vector<std::string> echoes;
  for (const std::string& frame : express) echoes.push_back("echo " + frame);
  EXPECT_EQ(client_inbox_.wait_for(echoes.size()), echoes);
  EXPECT_EQ(client_inbox_.peers(),
            std::vector<std::string>(echoes.size(), "server"));
}

// A frame announced over kMaxExpressBytes fails the connection before
// anything is read into the sink: TensorPipe's pending read fails, and the
// sink never sees it.
TEST_F(ExpressEcho, AnExpressFrameOverTheLimitFailsTheConnection) {
  write_express(client_impl_, std::string(kMaxExpressBytes + 1, 'x'));
  char byte = 0;
  EXPECT_FALSE(read_exactly(*server_, &byte, 1));
  EXPECT_TRUE(server_inbox_.wait_for(0).empty());
}

// The sink may fail the connection a frame came on: fail_express() ends it
// (its pending reads fail), and later frames are not delivered.
TEST_F(ExpressEcho, TheSinkMayFailItsConnection) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  server_inbox_sink_ = [calls](
                           const std::shared_ptr<tcp::ConnectionImpl>& connection,
                           absl::string_view) {
    ++*calls;
    fail_express(connection, "the test refuses it");
  };
  write_express(client_impl_, "refused");
  write_express(client_impl_, "never delivered");
  char byte = 0;
  EXPECT_FALSE(read_exactly(*server_, &byte, 1));
  EXPECT_FALSE(read_exactly(*client_, &byte, 1));
  EXPECT_EQ(calls->load(), 1);
}

// A context without a sink fails a connection that sends it an express
// frame.
class NoServerSink : public Connected {};

TEST_F(NoServerSink, AnExpressFrameFailsTheConnection) {
  write_express(client_impl_, "nobody takes this");
  char byte = 0;
  EXPECT_FALSE(read_exactly(*server_, &byte, 1));
}

}  // namespace
}  // namespace tether::backends::tensorpipe::internal
