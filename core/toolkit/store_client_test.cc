#include "core/toolkit/store_client.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "testing/status_matchers.h"

namespace tether::internal {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

int threads_of_this_process() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) {
      int n = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &n)) {
        return n;
      }
    }
  }
  return -1;
}

// LibTorch's own TCPStore serves; the client speaks its protocol.
class TcpStoreClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = std::chrono::seconds(30);
    server_ = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  }
  c10::intrusive_ptr<c10d::TCPStore> server_;
};

TEST_F(TcpStoreClientTest, SpeaksTheServersProtocol) {
  auto client = TcpStoreClient::connect("127.0.0.1", server_->getPort(),
                                        absl::Seconds(30));
  ASSERT_THAT(client, IsOk());
  TcpStoreClient& store = **client;
  store.set("a", bytes("alpha"));
  EXPECT_EQ(server_->get("a"), bytes("alpha"));
  server_->set("b", bytes("beta"));
  EXPECT_EQ(store.get("b"), bytes("beta"));
  EXPECT_EQ(store.add("n", 2), 2);
  EXPECT_EQ(server_->add("n", 3), 5);
  EXPECT_EQ(store.add("n", 0), 5);
  EXPECT_TRUE(store.check({"a", "b"}));
  EXPECT_FALSE(store.check({"a", "missing"}));
  // compareSet claims an absent key and otherwise returns the holder.
  EXPECT_EQ(store.compareSet("c", {}, bytes("first")), bytes("first"));
  EXPECT_EQ(store.compareSet("c", {}, bytes("second")), bytes("first"));
  EXPECT_EQ(store.getNumKeys(), server_->getNumKeys());
  EXPECT_TRUE(store.deleteKey("c"));
  EXPECT_FALSE(store.deleteKey("c"));
}

TEST_F(TcpStoreClientTest, WaitAndGetWaitForAKeySetLater) {
  auto client = TcpStoreClient::connect("127.0.0.1", server_->getPort(),
                                        absl::Seconds(30));
  ASSERT_THAT(client, IsOk());
  std::thread later([this] {
    absl::SleepFor(absl::Milliseconds(100));
    server_->set("late", bytes("here"));
  });
  EXPECT_EQ((*client)->get("late"), bytes("here"));
  later.join();
  try {
    (*client)->wait({"never"}, std::chrono::milliseconds(50));
    ADD_FAILURE() << "wait for a key nobody sets returned";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("Timeout"));
  }
  // The connection is still in step after a timed-out wait.
  EXPECT_EQ((*client)->get("late"), bytes("here"));
}

TEST(TcpStoreClient, OwnsNoThread) {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  const int before = threads_of_this_process();
  auto client = TcpStoreClient::connect("127.0.0.1", server->getPort(),
                                        absl::Seconds(30));
  ASSERT_THAT(client, IsOk());
  (*client)->set("k", bytes("v"));
  EXPECT_EQ(threads_of_this_process(), before);
}

// The server's process dies: the next request fails with an exception
// naming the store, and the process lives on (LibTorch's client aborts or
// spins here).
TEST(TcpStoreClient, ALostServerIsAnErrorNotAnAbort) {
  int ports[2];
  ASSERT_EQ(::pipe(ports), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    const int port = server->getPort();
    (void)!::write(ports[1], &port, sizeof(port));
    for (;;) ::pause();
  }
  int port = 0;
  ASSERT_EQ(::read(ports[0], &port, sizeof(port)),
            static_cast<ssize_t>(sizeof(port)));
  auto client = TcpStoreClient::connect("127.0.0.1", port, absl::Seconds(30));
  ASSERT_THAT(client, IsOk());
  (*client)->set("k", bytes("v"));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  for (int i = 0; i < 2; ++i) {
    try {
      (*client)->add("k2", 1);
      ADD_FAILURE() << "a request to a dead store succeeded";
    } catch (const std::exception& e) {
      EXPECT_THAT(e.what(), HasSubstr(absl::StrCat("127.0.0.1:", port)));
    }
  }
  ::close(ports[0]);
  ::close(ports[1]);
}

// A server that takes connections and never answers (a host cut off after
// the rendezvous): a request fails within the request timeout, not the
// store's.
TEST(TcpStoreClient, ASilentServerFailsARequestWithinTheRequestTimeout) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address),
                          &length),
            0);
  auto client = TcpStoreClient::connect("127.0.0.1", ntohs(address.sin_port),
                                        absl::Seconds(60));
  ASSERT_THAT(client, IsOk());
  (*client)->set_request_timeout(absl::Milliseconds(1));  // 1 s at least
  const absl::Time start = absl::Now();
  try {
    (*client)->add("k", 1);
    ADD_FAILURE() << "a silent server answered";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("did not answer in time"));
  }
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, TcpStoreClient::kMinRequestTimeout);
  EXPECT_LT(took, absl::Seconds(10));
  ::close(listener);
}

TEST(TcpStoreClient, NoServerIsUnavailableInBoundedTime) {
  // A port nobody listens on: bind one and close it.
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  int port;
  {
    auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    port = server->getPort();
  }
  const absl::Time start = absl::Now();
  auto client = TcpStoreClient::connect("127.0.0.1", port,
                                        absl::Milliseconds(300));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace tether::internal
