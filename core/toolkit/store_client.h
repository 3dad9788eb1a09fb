// TcpStoreClient: a client of the c10d TCPStore server (the store that
// LibTorch's TCPStore serves: tether's rank 0, or a launcher's agent such as
// torchrun's) that owns no thread.
//
// Why not LibTorch's own TCPStore client: in LibTorch 1.13 every TCPStore
// object starts a "worker daemon" thread on a second connection to the
// server, for watchKey(). When the server's process dies, that thread either
// spins on the closed socket (a core at 100% in every survivor) or throws
// std::system_error("Connection reset by peer") out of its thread, which
// aborts the process: a lost rank 0 took the survivors down with it. This
// client speaks the same wire protocol (a query type byte, then strings and
// byte vectors as a uint64 length and their bytes, in host order; every key
// behind LibTorch's "/" prefix, so both clients see the same keys) on one
// connection, one request at a time, every read and write bounded by the
// store's timeout. A lost server becomes an exception of the call that met
// it, as the c10d::Store interface reports every failure; the next call
// fails at once.
//
// wait() (and get(), which waits for its key first) uses the server's WAIT,
// which answers the moment the keys are set. 1.13's server cannot cancel a
// WAIT, so a wait that times out closes its connection (a late answer would
// be read as the answer of the next request) and opens a fresh one.
// watchKey() is not supported.
//
// Thread safety: every method may be called from any thread; requests run
// one at a time.
#ifndef TETHER_CORE_TOOLKIT_STORE_CLIENT_H_
#define TETHER_CORE_TOOLKIT_STORE_CLIENT_H_

#include <absl/base/thread_annotations.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace tether::internal {

class TcpStoreClient final : public c10d::Store {
 public:
  // Connects to the server at host:port, retrying refused connections until
  // `timeout` (the server may not listen yet). `timeout` also bounds every
  // later request. UNAVAILABLE naming the address if it cannot connect.
  [[nodiscard]] static absl::StatusOr<c10::intrusive_ptr<TcpStoreClient>>
  connect(const std::string& host, int port, absl::Duration timeout);

  // Use connect(); public only for c10::make_intrusive.
  struct Token {};
  TcpStoreClient(Token, int fd, std::string host, int port,
                 absl::Duration timeout);
  ~TcpStoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(
      const std::string& key, const std::vector<uint8_t>& expected,
      const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // How long the server may leave a request (not a wait for keys: that
  // waits as long as it is asked to) untaken or unanswered before it is
  // lost: the store's timeout, or this if shorter. The Worker sets its
  // peer timeout here (RpcOptions::peer_timeout, at least
  // kMinRequestTimeout): a worker cut off from the store's host then fails
  // its store requests, and so its join, within the peer timeout.
  void set_request_timeout(absl::Duration timeout);
  // The shortest request timeout: the server is a thread of rank 0's
  // process (LibTorch's TCPStore), which on a loaded machine may wait for
  // the scheduler longer than the agent thread that answers a PING.
  static constexpr absl::Duration kMinRequestTimeout = absl::Seconds(1);

 private:
  // One request: writes `request`, then reads what `read` asks for. Throws
  // (and closes the connection) on any failure.
  class Exchange;
  void fail(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void write_all(const std::string& bytes, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void read_exact(void* out, size_t n, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<uint8_t> read_vector(absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time deadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool check_locked(const std::vector<std::string>& keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void wait_for(const std::vector<std::string>& keys, absl::Duration timeout);

  const std::string host_;
  const int port_;
  const std::string address_;  // "host:port", for messages
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  absl::Duration request_timeout_ ABSL_GUARDED_BY(mu_) =
      absl::InfiniteDuration();
  std::string broken_ ABSL_GUARDED_BY(mu_);  // why the connection is gone
};

}  // namespace tether::internal

#endif  // TETHER_CORE_TOOLKIT_STORE_CLIENT_H_
