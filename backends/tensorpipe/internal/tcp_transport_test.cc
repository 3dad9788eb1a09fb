// tether's tcp transport on its own (no pipe, no agent): how it sends what
// TensorPipe writes. Two contexts in this process, a connection between
// them over loopback.
#include "backends/tensorpipe/internal/tcp_transport.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/context.h>
#include <tensorpipe/transport/listener.h>

#include <chrono>
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

std::shared_ptr<tpt::Context> transport_of(const std::string& self) {
  TcpTransportOptions options;
  options.self = self;
  options.members = {"client", "server"};
  return create_tcp_transport(options);
}

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
    server_context_ = transport_of("server");
    client_context_ = transport_of("client");
    ASSERT_NE(server_context_, nullptr);
    ASSERT_NE(client_context_, nullptr);
    listener_ = server_context_->listen("127.0.0.1");
    std::promise<std::shared_ptr<tpt::Connection>> accepted;
    listener_->accept([&accepted](const ::tensorpipe::Error& error,
                                  std::shared_ptr<tpt::Connection> connection) {
      accepted.set_value(error ? nullptr : std::move(connection));
    });
    client_ = client_context_->connect(listener_->addr());
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

}  // namespace
}  // namespace tether::backends::tensorpipe::internal
