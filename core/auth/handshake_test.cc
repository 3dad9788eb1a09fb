#include "core/auth/handshake.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "testing/status_matchers.h"

namespace tether::auth {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

Authenticator make(const std::string& secret) {
  absl::StatusOr<std::optional<Authenticator>> made =
      Authenticator::from(secret);
  EXPECT_TRUE(made.ok() && made->has_value());
  return **made;
}

// Runs the exchange between `client` and `server` to the end, as a
// transport would: what one side returns is what the other receives, in
// order. Returns the number of flights (a flight: the messages one side
// sends at once) and the first error.
struct Outcome {
  int flights = 0;
  absl::Status status;
};

Outcome run(Handshake& client, Handshake& server) {
  Outcome outcome;
  std::vector<HandshakeMessage> to_server = client.start();
  std::vector<HandshakeMessage> to_client = server.start();
  if (!to_server.empty()) ++outcome.flights;
  if (!to_client.empty()) ++outcome.flights;
  while (!to_server.empty() || !to_client.empty()) {
    std::vector<HandshakeMessage> next_to_client;
    for (const HandshakeMessage& message : to_server) {
      absl::StatusOr<std::vector<HandshakeMessage>> out =
          server.on_message(message);
      if (!out.ok()) {
        outcome.status = out.status();
        return outcome;
      }
      for (HandshakeMessage& m : *out) next_to_client.push_back(std::move(m));
    }
    std::vector<HandshakeMessage> next_to_server;
    for (const HandshakeMessage& message : to_client) {
      absl::StatusOr<std::vector<HandshakeMessage>> out =
          client.on_message(message);
      if (!out.ok()) {
        outcome.status = out.status();
        return outcome;
      }
      for (HandshakeMessage& m : *out) next_to_server.push_back(std::move(m));
    }
    if (!next_to_client.empty()) ++outcome.flights;
    if (!next_to_server.empty()) ++outcome.flights;
    to_client = std::move(next_to_client);
    to_server = std::move(next_to_server);
  }
  return outcome;
}

constexpr char kSecret[] = "0123456789abcdef-secret";

TEST(Handshake, SymmetricTwoStepsBothVerified) {
  const Authenticator a = make(kSecret);
  Handshake client(a, Role::kClient, "w0", "w1");
  Handshake server(a, Role::kServer, "w1", std::nullopt);
  Outcome outcome = run(client, server);
  EXPECT_THAT(outcome.status, IsOk());
  EXPECT_EQ(outcome.flights, 4);  // H|H, P|P: two rounds, both ways
  EXPECT_TRUE(client.done());
  EXPECT_TRUE(server.done());
  EXPECT_EQ(server.peer(), "w0");
}

TEST(Handshake, ResponderThreeSteps) {
  const Authenticator a = make(kSecret);
  Handshake client(a, Role::kClient, "w0", "w1", HandshakeShape::initiator());
  Handshake server(a, Role::kServer, "w1", std::nullopt,
                   HandshakeShape::responder_three_step());
  EXPECT_TRUE(server.start().empty());
  Outcome outcome = run(client, server);
  EXPECT_THAT(outcome.status, IsOk());
  EXPECT_EQ(outcome.flights, 3);  // c:H, s:H+P, c:P
  EXPECT_TRUE(client.done());
  EXPECT_TRUE(server.done());
}

TEST(Handshake, ResponderFourSteps) {
  const Authenticator a = make(kSecret);
  Handshake client(a, Role::kClient, "w0", "w1", HandshakeShape::initiator());
  Handshake server(a, Role::kServer, "w1", std::nullopt,
                   HandshakeShape::responder_four_step());
  Outcome outcome = run(client, server);
  EXPECT_THAT(outcome.status, IsOk());
  EXPECT_EQ(outcome.flights, 4);  // c:H, s:H, c:P, s:P
  EXPECT_TRUE(client.done());
  EXPECT_TRUE(server.done());
}

TEST(Handshake, WrongSecretIsRefusedNamingThePeer) {
  const Authenticator a = make(kSecret);
  const Authenticator b = make("another-secret-of-16-bytes");
  Handshake client(a, Role::kClient, "w0", "w1");
  Handshake server(b, Role::kServer, "w1", std::nullopt);
  Outcome outcome = run(client, server);
  EXPECT_THAT(outcome.status,
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("failed to authenticate (a different "
                                 "secret?)")));
  EXPECT_FALSE(server.verified());
}

TEST(Handshake, RefusesAWrongNameAndStepsOutOfTurn) {
  const Authenticator a = make(kSecret);
  Handshake client(a, Role::kClient, "w0", "w1");
  EXPECT_THAT(client.on_message({HandshakeStep::kHello, "w9", a.challenge()}),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("says it is 'w9'")));
  // Once failed, it refuses everything.
  EXPECT_THAT(client.on_message({HandshakeStep::kHello, "w1", a.challenge()}),
              StatusIs(absl::StatusCode::kUnauthenticated));

  Handshake server(a, Role::kServer, "w1", std::nullopt);
  EXPECT_THAT(server.on_message({HandshakeStep::kProof, "w0", "x"}),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("worker 'w0' sent a proof out of turn")));

  Handshake twice(a, Role::kServer, "w1", std::nullopt);
  ASSERT_THAT(twice.on_message({HandshakeStep::kHello, "w0", a.challenge()}),
              IsOk());
  EXPECT_THAT(twice.on_message({HandshakeStep::kHello, "w0", a.challenge()}),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("sent a second challenge")));

  Handshake short_challenge(a, Role::kServer, "w1", std::nullopt);
  EXPECT_THAT(short_challenge.on_message({HandshakeStep::kHello, "w0", "abc"}),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("a challenge of 3 bytes")));
}

TEST(Handshake, AReplayedProofFails) {
  const Authenticator a = make(kSecret);
  // A proof recorded from one exchange does not pass in another: the
  // challenges are fresh.
  Handshake c1(a, Role::kClient, "w0", "w1");
  Handshake s1(a, Role::kServer, "w1", std::nullopt);
  std::vector<HandshakeMessage> c1_hello = c1.start();
  std::vector<HandshakeMessage> s1_hello = s1.start();
  absl::StatusOr<std::vector<HandshakeMessage>> c1_proof =
      c1.on_message(s1_hello[0]);
  ASSERT_THAT(c1_proof, IsOk());

  Handshake s2(a, Role::kServer, "w1", std::nullopt);
  (void)s2.start();
  ASSERT_THAT(s2.on_message(c1_hello[0]), IsOk());
  EXPECT_THAT(s2.on_message((*c1_proof)[0]),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("failed to authenticate")));
}

}  // namespace
}  // namespace tether::auth
