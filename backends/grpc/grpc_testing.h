// Test helpers of the gRPC backend's own tests: agents built one by one with
// settings per rank, a TCP proxy that breaks or silences real connections,
// and a raw gRPC client that talks to an agent as a stranger would.
//
// Used by grpc_backend_test.cc and grpc_tls_test.cc. Everything runs on real
// sockets on loopback.
#ifndef TETHER_BACKENDS_GRPC_GRPC_TESTING_H_
#define TETHER_BACKENDS_GRPC_GRPC_TESTING_H_

#include <absl/base/thread_annotations.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/status.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/agent.h"
#include "core/rendezvous.h"
#include "testing/agent_testing.h"
#include "testing/hostile_dialect.h"

namespace tether::backends::grpc_testing {

// `size` workers named "agent<rank>" that met through a fresh memory://
// store, without agents yet. A test failure if the rendezvous fails.
std::vector<RendezvousResult> meet_group(int size);

// Creates the agents of `members` concurrently (creation waits for every
// rank), rank r with `settings[r]`, each with `busy_poll`
// (AgentSetup::poll, whatever the load).
std::vector<absl::StatusOr<std::unique_ptr<Agent>>> create_agents(
    const std::vector<RendezvousResult>& members,
    const std::vector<::tether::testing::AgentSettings>& settings,
    absl::Duration busy_poll = absl::ZeroDuration());

// The "host:port" an agent of `member`'s group published for `rank`.
std::string published_address(const RendezvousResult& member, int rank);

// A TCP proxy on 127.0.0.1 to one target, forwarding each connection it
// accepts until the test breaks or silences it. Thread-safe.
class TcpProxy {
 public:
  // `target` is "127.0.0.1:port".
  explicit TcpProxy(const std::string& target);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  // "127.0.0.1:port" of the proxy itself.
  std::string address() const;

  // Closes every connection open now, both ways (as a crash or a broken
  // link would); connections accepted later are forwarded. Returns once
  // done.
  void cut();

  // Every connection open now stops carrying bytes but stays open (as a
  // frozen peer or a silent network would); later ones are forwarded.
  // Returns once done.
  void blackhole();

 private:
  struct Pair {
    int client = -1;
    int server = -1;
    bool silent = false;
  };
  enum class Command { kNone, kCut, kBlackhole };

  void run();
  // Asks the loop to apply `command` and waits until it has.
  void command(Command command);

  int listener_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  int target_port_ = 0;
  absl::Mutex mu_;
  Command pending_ ABSL_GUARDED_BY(mu_) = Command::kNone;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Pair> pairs_;  // only the loop thread
  std::thread thread_;
};

// Opens a stream of the agent's method to `address` with `metadata`, writes
// `messages` (raw bytes, one gRPC message each), then half-closes it unless
// `writes_done` is false (the stream then stays open, saying nothing more),
// and returns the status the stream ends with: DEADLINE_EXCEEDED if it has
// not ended after `deadline` (at most testing::kBound). For tests of what an
// agent does with strangers and garbage.
::grpc::Status raw_stream(
    const std::string& address,
    std::shared_ptr<::grpc::ChannelCredentials> credentials,
    const std::map<std::string, std::string>& metadata,
    const std::vector<std::string>& messages, bool writes_done = true,
    absl::Duration deadline = absl::Seconds(10));

// What the gRPC agent's protocol adds to the hostile-peer suite
// (testing/hostile_peers.h): HTTP/2 openings that announce huge frames, and
// frames of the agent's own framing (internal/framing.h) that announce
// huge or negative buffer sizes, delivered on a raw stream that claims to
// come from "agent0" to "agent1".
::tether::testing::HostileDialect hostile_dialect();

// Certificates made by the openssl CLI for one test run, in a fresh
// directory: a CA, a rogue CA, "worker" (signed by the CA, for 127.0.0.1
// and localhost), "rogue" (signed by the rogue CA), "named" (signed by the
// CA, for DNS:tether-worker only) and junk.pem (not a certificate).
class Certificates {
 public:
  // Makes them; empty directory() if openssl failed (a test failure).
  Certificates();

  const std::string& directory() const { return directory_; }

  std::string path(const std::string& file) const {
    return absl::StrCat(directory_, "/", file);
  }

  // The contents of `file`.
  std::string read(const std::string& file) const;

  // Settings for an agent whose identity is `name` (.pem and .key), trusting
  // the peers that `ca` signed.
  ::tether::testing::AgentSettings settings(const std::string& name,
                                            const std::string& ca = "ca",
                                            bool mutual = true) const;

 private:
  std::string directory_;
};

}  // namespace tether::backends::grpc_testing

#endif  // TETHER_BACKENDS_GRPC_GRPC_TESTING_H_
