// The gRPC backend with TLS: certificates made by the openssl CLI when the
// test starts (a CA, a rogue CA, workers' certificates signed by each),
// agents talking over TLS and mutual TLS, and peers or clients with the
// wrong certificate, none, or no TLS at all, refused.
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "backends/grpc/grpc_agent.h"
#include "backends/grpc/grpc_testing.h"
#include "core/agent.h"
#include "testing/agent_testing.h"
#include "testing/status_matchers.h"

namespace tether::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tether::backends::grpc_backend;
using ::tether::backends::grpc_testing::Certificates;
using ::tether::backends::grpc_testing::create_agents;
using ::tether::backends::grpc_testing::meet_group;
using ::tether::backends::grpc_testing::published_address;
using ::tether::backends::grpc_testing::raw_stream;

class GrpcTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certificates_ = new Certificates(); }
  static void TearDownTestSuite() {
    delete certificates_;
    certificates_ = nullptr;
  }

  void SetUp() override {
    ASSERT_FALSE(certificates_->directory().empty())
        << "no certificates (is the openssl CLI installed?)";
  }

  const Certificates& certs() const { return *certificates_; }

  static Certificates* certificates_;
};

Certificates* GrpcTls::certificates_ = nullptr;

absl::StatusOr<Message> call(Agent& from, const Agent& to, Message request) {
  return from.send(to.self(), std::move(request), kBound)
      .get(absl::Now() + kBound);
}

// Both ways, with a large storage.
void expect_round_trips(Agent& a, Agent& b) {
  for (auto [from, to] : {std::pair<Agent*, Agent*>{&a, &b}, {&b, &a}}) {
    Message request = ping("tls");
    request.storages.push_back(make_storage(4 << 20, 3));
    absl::StatusOr<Message> response = call(*from, *to, std::move(request));
    ASSERT_THAT(response, IsOk());
    EXPECT_EQ(response->payload, "tls/pong");
    EXPECT_TRUE(storage_matches(response->storages[0], 4 << 20, 3));
  }
}

TEST_F(GrpcTls, MutualTlsRoundTrip) {
  ::tether::testing::AgentGroup group(grpc_backend(), 2,
                                      certs().settings("worker"));
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  expect_round_trips(group[0], group[1]);
}

TEST_F(GrpcTls, ServerOnlyTlsRoundTrip) {
  ::tether::testing::AgentGroup group(
      grpc_backend(), 2, certs().settings("worker", "ca", /*mutual=*/false));
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  expect_round_trips(group[0], group[1]);
}

TEST_F(GrpcTls, PeerWithACertificateOfAnotherCaIsRejected) {
  std::vector<RendezvousResult> members = meet_group(2);
  ASSERT_EQ(members.size(), 2u);
  // agent1 trusts the right CA but shows a certificate the rogue CA signed.
  auto agents = create_agents(
      members, {certs().settings("worker"), certs().settings("rogue")});
  ASSERT_THAT(agents[0], IsOk());
  ASSERT_THAT(agents[1], IsOk());
  Agent& good = **agents[0];
  Agent& rogue = **agents[1];
  ASSERT_THAT(good.start(echo), IsOk());
  ASSERT_THAT(rogue.start(echo), IsOk());
  // agent0 cannot verify agent1 as a server...
  EXPECT_THAT(call(good, rogue, ping("to rogue")),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent1")));
  // ...and refuses it as a client.
  EXPECT_THAT(call(rogue, good, ping("from rogue")),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("agent0")));
}

TEST_F(GrpcTls, ClientsWithoutTheRightCertificateAreRejected) {
  ::tether::testing::AgentGroup group(grpc_backend(), 1,
                                      certs().settings("worker"));
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  std::vector<uint8_t> bytes = group.store().get("tether/grpc/0");
  const std::string address(bytes.begin(), bytes.end());
  const std::map<std::string, std::string> as_agent0 = {
      {"tether-from-rank", "0"},
      {"tether-from-name", "agent0"},
      {"tether-to-name", "agent0"}};
  auto credentials = [this](const std::string& name) {
    ::grpc::SslCredentialsOptions options;
    options.pem_root_certs = certs().read("ca.pem");
    if (!name.empty()) {
      options.pem_private_key = certs().read(name + ".key");
      options.pem_cert_chain = certs().read(name + ".pem");
    }
    return ::grpc::SslCredentials(options);
  };
  // The right certificate gets a stream (which ends as the client leaves).
  ::grpc::Status accepted =
      raw_stream(address, credentials("worker"), as_agent0, {});
  EXPECT_THAT(accepted.error_message(),
              HasSubstr("worker 'agent0' ended the stream"));
  for (const auto& [what, channel_credentials] : std::vector<
           std::pair<std::string, std::shared_ptr<::grpc::ChannelCredentials>>>{
           {"a certificate of another CA", credentials("rogue")},
           {"no certificate", credentials("")},
           {"no TLS", ::grpc::InsecureChannelCredentials()},
       }) {
    ::grpc::Status refused =
        raw_stream(address, channel_credentials, as_agent0, {});
    EXPECT_EQ(refused.error_code(), ::grpc::StatusCode::UNAVAILABLE) << what;
    EXPECT_THAT(refused.error_message(), Not(HasSubstr("ended the stream")))
        << what;
  }
}

TEST_F(GrpcTls, ServerNameSettingMatchesCertificatesWithoutTheAddress) {
  {
    // The certificate names "tether-worker", not 127.0.0.1.
    ::tether::testing::AgentGroup group(grpc_backend(), 2,
                                        certs().settings("named"));
    ASSERT_TRUE(group.ok());
    group.start_all(echo);
    EXPECT_THAT(call(group[0], group[1], ping("x")),
                StatusIs(absl::StatusCode::kUnavailable));
  }
  AgentSettings settings = certs().settings("named");
  settings["grpc.tls_server_name"] = "tether-worker";
  ::tether::testing::AgentGroup group(grpc_backend(), 2, settings);
  ASSERT_TRUE(group.ok());
  group.start_all(echo);
  expect_round_trips(group[0], group[1]);
}

TEST_F(GrpcTls, FilesThatAreNotPemAreInvalidArgument) {
  AgentSettings settings = certs().settings("worker");
  settings["grpc.tls_cert"] = certs().path("junk.pem");
  ::tether::testing::AgentGroup group(grpc_backend(), 1, settings);
  EXPECT_THAT(group.error(0), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("grpc.tls_cert")));
}

}  // namespace
}  // namespace tether::testing
