#include "backends/libfabric/internal/record.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>
#include <string>

#include "testing/status_matchers.h"

namespace tether::backends::libfabric::internal {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

Record sample() {
  Record record;
  record.provider = "tcp;ofi_rxm";
  record.address = std::string("\x00\x01\xfe\xff=\n", 6);  // raw bytes
  record.buffer_size = 17408;
  record.credits = 16;
  record.mode = RendezvousMode::kTagged;
  record.pid = 4242;
  record.host = "boot/pid:[1]/net:[2]";
  record.doorbell = std::string("\0tether", 7);  // abstract socket name
  record.name = "trainer=0";
  return record;
}

TEST(Record, RoundTrips) {
  const Record record = sample();
  absl::StatusOr<Record> decoded = decode_record(encode_record(record));
  ASSERT_THAT(decoded.status(), IsOk());
  EXPECT_EQ(decoded->provider, record.provider);
  EXPECT_EQ(decoded->address, record.address);
  EXPECT_EQ(decoded->buffer_size, record.buffer_size);
  EXPECT_EQ(decoded->credits, record.credits);
  EXPECT_EQ(decoded->mode, record.mode);
  EXPECT_EQ(decoded->pid, record.pid);
  EXPECT_EQ(decoded->host, record.host);
  EXPECT_EQ(decoded->doorbell, record.doorbell);
  EXPECT_EQ(decoded->name, record.name);
}

TEST(Record, SkipsFieldsOfLaterVersions) {
  absl::StatusOr<Record> decoded =
      decode_record(encode_record(sample()) + "colour=blue\n");
  ASSERT_THAT(decoded.status(), IsOk());
  EXPECT_EQ(decoded->name, "trainer=0");
}

TEST(Record, DoorbellAndNameAreOptional) {
  Record record = sample();
  std::string text = encode_record(record);
  // An earlier version's record: neither field.
  text = text.substr(0, text.find("doorbell="));
  absl::StatusOr<Record> decoded = decode_record(text);
  ASSERT_THAT(decoded.status(), IsOk());
  EXPECT_EQ(decoded->doorbell, "");
  EXPECT_EQ(decoded->name, "");
}

TEST(Record, NamesTheBadField) {
  std::string text = encode_record(sample());
  const std::string credits = "credits=16";
  text.replace(text.find(credits), credits.size(), "credits=0");
  EXPECT_THAT(decode_record(text),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad field 'credits'")));
  EXPECT_THAT(decode_record("provider=shm\naddress=abc\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad field 'address'")));
  EXPECT_THAT(decode_record("rendezvous=write\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad field 'rendezvous'")));
}

TEST(Record, RefusesAnIncompleteRecord) {
  std::string text = encode_record(sample());
  text = text.substr(0, text.find("pid="));
  EXPECT_THAT(decode_record(text),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("incomplete libfabric address record")));
}

template <typename SockAddr>
std::string raw(const SockAddr& address) {
  return std::string(reinterpret_cast<const char*>(&address), sizeof(address));
}

TEST(Record, EndpointOfASocketAddressedProvider) {
  Record record = sample();
  sockaddr_in in = {};
  in.sin_family = AF_INET;
  in.sin_port = htons(40123);
  ASSERT_EQ(::inet_pton(AF_INET, "10.1.2.3", &in.sin_addr), 1);
  record.address = raw(in);
  absl::StatusOr<std::optional<Endpoint>> endpoint =
      endpoint_in_record(record);
  ASSERT_THAT(endpoint.status(), IsOk());
  ASSERT_TRUE(endpoint->has_value());
  EXPECT_EQ((*endpoint)->ip, "10.1.2.3");
  EXPECT_EQ((*endpoint)->port, 40123);

  sockaddr_in6 in6 = {};
  in6.sin6_family = AF_INET6;
  in6.sin6_port = htons(80);
  ASSERT_EQ(::inet_pton(AF_INET6, "fe80::1", &in6.sin6_addr), 1);
  record.provider = "tcp";
  record.address = raw(in6);
  endpoint = endpoint_in_record(record);
  ASSERT_THAT(endpoint.status(), IsOk());
  ASSERT_TRUE(endpoint->has_value());
  EXPECT_EQ((*endpoint)->ip, "fe80::1");
  EXPECT_EQ((*endpoint)->port, 80);
}

TEST(Record, NoEndpointForShmAndAnErrorForANameThatIsNoSockaddr) {
  Record record = sample();
  record.provider = "shm";
  record.address = "fi_shm://4242:0";
  absl::StatusOr<std::optional<Endpoint>> endpoint =
      endpoint_in_record(record);
  ASSERT_THAT(endpoint.status(), IsOk());
  EXPECT_FALSE(endpoint->has_value());

  record.provider = "tcp;ofi_rxm";
  record.address = sample().address;  // six raw bytes
  EXPECT_THAT(endpoint_in_record(record),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("provider 'tcp;ofi_rxm' (6 bytes")));
}

TEST(Record, HostIdentityIsStable) {
  // Empty where /proc cannot tell; else the same for the whole process.
  EXPECT_EQ(host_identity(), host_identity());
}

}  // namespace
}  // namespace tether::backends::libfabric::internal
