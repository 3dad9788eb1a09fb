#include "backends/grpc/grpc_testing.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/notification.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_callback.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>

#include "backends/grpc/grpc_agent.h"
#include "backends/grpc/internal/framing.h"
#include "testing/status_matchers.h"

namespace tether::backends::grpc_testing {

using ::tether::testing::AgentSettings;
using ::tether::testing::IsOk;
using ::tether::testing::kBound;

std::vector<RendezvousResult> meet_group(int size) {
  static std::atomic<int> counter{0};
  const std::string init_method =
      absl::StrCat("memory://grpc_testing_", counter++, "_", ::getpid());
  std::vector<absl::StatusOr<RendezvousResult>> met(
      size, absl::UnknownError("not met"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&met, &init_method, rank, size] {
      met[rank] = ::tether::testing::meet_as_agent(init_method, rank, size);
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<RendezvousResult> members;
  for (auto& member : met) {
    EXPECT_THAT(member, IsOk());
    if (member.ok()) members.push_back(*std::move(member));
  }
  return members;
}

std::vector<absl::StatusOr<std::unique_ptr<Agent>>> create_agents(
    const std::vector<RendezvousResult>& members,
    const std::vector<AgentSettings>& settings, absl::Duration busy_poll) {
  std::vector<absl::StatusOr<std::unique_ptr<Agent>>> agents;
  for (size_t i = 0; i < members.size(); ++i) {
    agents.emplace_back(absl::UnknownError("not created"));
  }
  std::vector<std::thread> threads;
  const Backend backend = grpc_backend();
  for (size_t rank = 0; rank < members.size(); ++rank) {
    threads.emplace_back([&, rank] {
      agents[rank] = ::tether::testing::create_agent(
          backend, members[rank], settings[rank], MessageLimits(), busy_poll);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return agents;
}

std::string published_address(const RendezvousResult& member, int rank) {
  std::vector<uint8_t> bytes =
      member.store->get(absl::StrCat("tether/grpc/", rank));
  return std::string(bytes.begin(), bytes.end());
}

// ----------------------------------------------------------------- TcpProxy

namespace {

int listen_on_loopback(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd, 16) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ADD_FAILURE() << "the proxy cannot listen";
    if (fd >= 0) ::close(fd);
    return -1;
  }
  port = ntohs(address.sin_port);
  return fd;
}

int connect_to_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&address),
                           sizeof(address)) == 0) {
    const int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    return fd;
  }
  if (fd >= 0) ::close(fd);
  return -1;
}

// Writes all of `data` to `fd`; false if the connection failed.
bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void close_pair(int client, int server) {
  ::shutdown(client, SHUT_RDWR);
  ::shutdown(server, SHUT_RDWR);
  ::close(client);
  ::close(server);
}

}  // namespace

TcpProxy::TcpProxy(const std::string& target) {
  const size_t colon = target.rfind(':');
  EXPECT_TRUE(colon != std::string::npos &&
              absl::SimpleAtoi(target.substr(colon + 1), &target_port_))
      << target;
  listener_ = listen_on_loopback(port_);
  EXPECT_EQ(::pipe2(wake_, O_CLOEXEC), 0);
  thread_ = std::thread([this] { run(); });
}

TcpProxy::~TcpProxy() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  const char byte = 0;
  (void)!::write(wake_[1], &byte, 1);
  thread_.join();
  for (const Pair& pair : pairs_) close_pair(pair.client, pair.server);
  ::close(listener_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

std::string TcpProxy::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

void TcpProxy::cut() { command(Command::kCut); }
void TcpProxy::blackhole() { command(Command::kBlackhole); }

void TcpProxy::command(Command command) {
  absl::MutexLock lock(&mu_);
  pending_ = command;
  const char byte = 0;
  (void)!::write(wake_[1], &byte, 1);
  auto applied = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_ == Command::kNone;
  };
  EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&applied), kBound));
}

void TcpProxy::run() {
  std::vector<char> buffer(64 << 10);
  while (true) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listener_, POLLIN, 0}};
    for (const Pair& pair : pairs_) {
      fds.push_back({pair.client, POLLIN, 0});
      fds.push_back({pair.server, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents != 0) {
      char drain[16];
      (void)!::read(wake_[0], drain, sizeof(drain));
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (pending_ == Command::kCut) {
        for (const Pair& pair : pairs_) close_pair(pair.client, pair.server);
        pairs_.clear();
      } else if (pending_ == Command::kBlackhole) {
        for (Pair& pair : pairs_) pair.silent = true;
      }
      pending_ = Command::kNone;
      continue;  // the fds changed
    }
    std::vector<size_t> broken;
    for (size_t i = 0; i < pairs_.size(); ++i) {
      for (int side = 0; side < 2; ++side) {
        const pollfd& polled = fds[2 + 2 * i + side];
        if (polled.revents == 0) continue;
        Pair& pair = pairs_[i];
        const int from = side == 0 ? pair.client : pair.server;
        const int to = side == 0 ? pair.server : pair.client;
        const ssize_t n = ::recv(from, buffer.data(), buffer.size(), 0);
        if (n <= 0 || (!pair.silent &&
                       !write_all(to, buffer.data(), static_cast<size_t>(n)))) {
          broken.push_back(i);
          break;
        }
      }
    }
    for (auto it = broken.rbegin(); it != broken.rend(); ++it) {
      close_pair(pairs_[*it].client, pairs_[*it].server);
      pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(*it));
    }
    if (fds[1].revents != 0) {
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = connect_to_loopback(target_port_);
      if (server < 0) {
        ::close(client);
        continue;
      }
      const int on = 1;
      ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      pairs_.push_back(Pair{client, server, false});
    }
  }
}

// --------------------------------------------------------------- raw_stream

namespace {

// How a raw stream ended; shared with its reactor.
struct RawOutcome {
  ::grpc::Status status;
  absl::Notification done;
};

class RawClient final
    : public ::grpc::ClientBidiReactor<::grpc::ByteBuffer, ::grpc::ByteBuffer> {
 public:
  // `channel` must outlive the call. raw_stream() deletes the reactor and
  // then the channel after OnDone, on its own thread: gRPC must not destroy
  // a channel (which the context holds too) in one of its callbacks.
  RawClient(std::vector<std::string> messages, bool writes_done,
            absl::Duration deadline, std::shared_ptr<RawOutcome> outcome)
      : messages_(std::move(messages)),
        writes_done_(writes_done),
        deadline_(deadline),
        outcome_(std::move(outcome)) {}

  void start(const std::shared_ptr<::grpc::Channel>& channel,
             const std::map<std::string, std::string>& metadata) {
    ::grpc::GenericStub stub(channel);
    for (const auto& [key, value] : metadata) context_.AddMetadata(key, value);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
    stub.PrepareBidiStreamingCall(&context_, "/tether.Agent/Stream",
                                  ::grpc::StubOptions(), this);
    StartRead(&read_);
    write_next();
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (ok) StartRead(&read_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) write_next();
  }
  void OnDone(const ::grpc::Status& status) override {
    outcome_->status = status;
    outcome_->done.Notify();
  }

 private:
  // Only from start() and OnWriteDone: one write at a time.
  void write_next() {
    if (next_ == messages_.size()) {
      if (writes_done_) StartWritesDone();
      return;
    }
    ::grpc::Slice slice(messages_[next_]);
    ++next_;
    write_ = ::grpc::ByteBuffer(&slice, 1);
    StartWrite(&write_);
  }

  const std::vector<std::string> messages_;
  const bool writes_done_;
  const absl::Duration deadline_;
  const std::shared_ptr<RawOutcome> outcome_;
  size_t next_ = 0;
  ::grpc::ClientContext context_;
  ::grpc::ByteBuffer read_;
  ::grpc::ByteBuffer write_;
};

}  // namespace

::grpc::Status raw_stream(
    const std::string& address,
    std::shared_ptr<::grpc::ChannelCredentials> credentials,
    const std::map<std::string, std::string>& metadata,
    const std::vector<std::string>& messages, bool writes_done,
    absl::Duration deadline) {
  ::grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  std::shared_ptr<::grpc::Channel> channel = ::grpc::CreateCustomChannel(
      absl::StrCat(address[0] == '[' ? "ipv6:" : "ipv4:", address),
      std::move(credentials), args);
  auto outcome = std::make_shared<RawOutcome>();
  auto client = std::make_unique<RawClient>(
      messages, writes_done, std::min(deadline, kBound), outcome);
  client->start(channel, metadata);
  // gRPC ends the call by its deadline; a little more for it to say so.
  if (!outcome->done.WaitForNotificationWithTimeout(kBound +
                                                    absl::Seconds(5))) {
    ADD_FAILURE() << "a raw stream to " << address << " did not end";
    // Still in gRPC's hands: leaked rather than freed under it.
    client.release();
    new std::shared_ptr<::grpc::Channel>(std::move(channel));
    return ::grpc::Status(::grpc::StatusCode::DEADLINE_EXCEEDED, "no end");
  }
  return outcome->status;
}

// ------------------------------------------------------ hostile dialect

namespace {

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

// A request head frame (internal/framing.h) announcing buffers of `sizes`
// bytes, with no inline bytes (so each size must be 0 or too large to be
// inline); its prefix says the body is `body_bytes` long (-1: as long as it
// is).
std::string head_frame(const std::vector<uint64_t>& sizes,
                       int64_t body_bytes = -1) {
  std::string body;
  put_le(body, static_cast<uint32_t>(MessageType::kPing), 4);
  put_le(body, 0, 4);   // status code
  put_le(body, 7, 8);   // id
  put_le(body, sizes.size(), 4);
  put_le(body, 0, 4);
  for (uint64_t size : sizes) put_le(body, size, 8);
  std::string frame = "TGF1";
  frame.push_back(static_cast<char>(grpc::internal::FrameKind::kRequest));
  frame.append(3, '\0');
  put_le(frame, body_bytes < 0 ? body.size() : static_cast<uint64_t>(body_bytes),
         8);
  return frame + body;
}

// The HTTP/2 client preface and the header of a frame of `type` on
// `stream` announcing a payload of 2^24 - 1 bytes (the most its 24-bit
// length says), which never comes.
std::string http2_huge_frame(uint8_t type, uint32_t stream) {
  std::string bytes = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  bytes.append("\xff\xff\xff", 3);
  bytes.push_back(static_cast<char>(type));
  bytes.push_back('\0');  // flags
  for (int i = 3; i >= 0; --i) {
    bytes.push_back(static_cast<char>((stream >> (8 * i)) & 0xff));
  }
  return bytes;
}

}  // namespace

::tether::testing::HostileDialect hostile_dialect() {
  ::tether::testing::HostileDialect dialect;
  dialect.openings = {
      {"an HTTP/2 SETTINGS frame announcing 2^24 - 1 bytes",
       http2_huge_frame(/*SETTINGS*/ 4, 0)},
      {"an HTTP/2 HEADERS frame announcing 2^24 - 1 bytes",
       http2_huge_frame(/*HEADERS*/ 1, 1)},
  };
  dialect.frames = {
      {"a head announcing one buffer of 2^62 bytes",
       head_frame({uint64_t{1} << 62})},
      {"a head announcing one buffer of -2^63 bytes (as an i64)",
       head_frame({uint64_t{1} << 63})},
      {"a head announcing one buffer of 2^64 - 1 bytes", head_frame({~0ull})},
      {"a head announcing an empty payload and 3 buffers of 2^40 bytes",
       head_frame({0, uint64_t{1} << 40, uint64_t{1} << 40,
                   uint64_t{1} << 40})},
      {"a frame prefix announcing a body of 2^62 bytes",
       head_frame({1}, int64_t{1} << 62)},
  };
  Message request;
  request.type = MessageType::kPing;
  request.id = 7;
  request.payload = "a stranger's request";
  grpc::internal::OutgoingCursor cursor(
      grpc::internal::make_request(std::move(request)));
  std::vector<::grpc::Slice> slices;
  while (!cursor.done()) cursor.append_next_frame(1 << 20, slices);
  for (const ::grpc::Slice& slice : slices) {
    dialect.request.append(reinterpret_cast<const char*>(slice.begin()),
                           slice.size());
  }
  dialect.deliver = [](const std::string& address, const std::string& frame,
                       absl::Duration bound) {
    const ::grpc::Status status =
        raw_stream(address, ::grpc::InsecureChannelCredentials(),
                   {{"tether-from-rank", "0"},
                    {"tether-from-name", "agent0"},
                    {"tether-to-name", "agent1"}},
                   {frame}, /*writes_done=*/false, bound);
    // absl's codes are gRPC's, number for number.
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  };
  return dialect;
}

namespace {

// For a single-quoted shell word.
std::string shell_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Certificates::Certificates() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tether_tls_XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) return;
  const std::string script = absl::StrCat(R"(set -e
cd ')",
                                          pattern, R"('
cat > ca.cnf <<'EOF'
[req]
distinguished_name = dn
[dn]
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
EOF
ca() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $1.key
  openssl req -x509 -new -key $1.key -out $1.pem -days 2 -subj "/CN=$1" \
      -config ca.cnf -extensions ca_ext
}
leaf() {  # name, ca, subjectAltName
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $1.key
  openssl req -new -key $1.key -out $1.csr -subj "/CN=$1"
  printf '%s\n' 'basicConstraints = CA:FALSE' \
      'keyUsage = critical,digitalSignature,keyEncipherment' \
      'extendedKeyUsage = serverAuth,clientAuth' \
      "subjectAltName = $3" > $1.ext
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial \
      -out $1.pem -days 2 -extfile $1.ext
}
ca ca
ca rogue_ca
leaf worker ca IP:127.0.0.1,DNS:localhost
leaf rogue rogue_ca IP:127.0.0.1,DNS:localhost
leaf named ca DNS:tether-worker
echo 'not a certificate' > junk.pem
)");
  const std::string command =
      absl::StrCat("/bin/sh -c '", shell_escape(script), "' 2>&1");
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) return;
  char line[512];
  std::string log;
  while (std::fgets(line, sizeof(line), out) != nullptr) log += line;
  if (::pclose(out) != 0) {
    ADD_FAILURE() << "openssl failed:\n" << log;
    return;
  }
  directory_ = pattern;
}

std::string Certificates::read(const std::string& file) const {
  std::ifstream in(path(file));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

::tether::testing::AgentSettings Certificates::settings(
    const std::string& name, const std::string& ca, bool mutual) const {
  return {{"grpc.tls_cert", path(name + ".pem")},
          {"grpc.tls_key", path(name + ".key")},
          {"grpc.tls_ca", path(ca + ".pem")},
          {"grpc.tls_mutual", mutual ? "on" : "off"}};
}

}  // namespace tether::backends::grpc_testing
