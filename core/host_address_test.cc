#include "core/host_address.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstdlib>
#include <string>

#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::testing::HasSubstr;
using tether::testing::IsOk;
using tether::testing::StatusIs;

// Sets the interface variables for one test and restores them after.
class HostAddress : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name :
         {kSocketIfnameVariable, kTensorPipeSocketIfnameVariable}) {
      ::unsetenv(name);
    }
  }
  void TearDown() override { SetUp(); }
};

// A non-loopback IPv4 address of this machine, or "" if it has none.
std::string some_other_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* entry = list; entry != nullptr && found.empty();
       entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) {
      continue;
    }
    auto* in = reinterpret_cast<sockaddr_in*>(entry->ifa_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text))) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

TEST_F(HostAddress, NoRendezvousHostIsLoopback) {
  EXPECT_EQ(*default_host_address(""), "127.0.0.1");
}

TEST_F(HostAddress, ALoopbackRendezvousKeepsLoopback) {
  EXPECT_EQ(*default_host_address("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(*default_host_address("127.0.0.2"), "127.0.0.1");
  EXPECT_EQ(*default_host_address("localhost"), "127.0.0.1");
  EXPECT_EQ(*default_host_address("::1"), "127.0.0.1");
}

TEST_F(HostAddress, ARendezvousElsewhereGivesTheRoutesSource) {
  const std::string other = some_other_address();
  if (other.empty()) GTEST_SKIP() << "no address here but loopback";
  // A route to one of this machine's own addresses starts from it.
  EXPECT_EQ(*route_source_address(other), other);
  absl::StatusOr<HostAddressChoice> choice = choose_host_address(other);
  ASSERT_THAT(choice, IsOk());
  EXPECT_EQ(choice->address, other);
  EXPECT_THAT(choice->reason, HasSubstr("the route to the rendezvous host"));
}

TEST_F(HostAddress, TheInterfaceVariableWins) {
  ::setenv(kSocketIfnameVariable, "lo", 1);
  ::setenv(kTensorPipeSocketIfnameVariable, "no-such-interface0", 1);
  absl::StatusOr<HostAddressChoice> choice = choose_host_address("10.1.2.3");
  ASSERT_THAT(choice, IsOk());
  EXPECT_EQ(choice->address, "127.0.0.1");
  EXPECT_EQ(choice->reason, "interface lo (TETHER_SOCKET_IFNAME)");
}

TEST_F(HostAddress, TensorPipesVariableIsReadToo) {
  ::setenv(kTensorPipeSocketIfnameVariable, "lo", 1);
  absl::StatusOr<HostAddressChoice> choice = choose_host_address("");
  ASSERT_THAT(choice, IsOk());
  EXPECT_EQ(choice->reason, "interface lo (TP_SOCKET_IFNAME)");
}

TEST_F(HostAddress, AnInterfaceThatIsNotThereIsAnError) {
  ::setenv(kSocketIfnameVariable, "no-such-interface0", 1);
  EXPECT_THAT(default_host_address("127.0.0.1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("TETHER_SOCKET_IFNAME='no-such-interface0' "
                                 "names no usable network interface")));
  EXPECT_THAT(interface_address("no-such-interface0"),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace tether
