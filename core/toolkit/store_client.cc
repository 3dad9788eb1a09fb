#include "core/toolkit/store_client.h"

#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace tether::internal {
namespace {

// The server's query types and answers (c10d's TCPStore wire protocol).
enum class Query : uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kGetNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,
};
constexpr uint8_t kReady = 0;     // CheckResponseType::READY
constexpr uint8_t kNotReady = 1;  // CheckResponseType::NOT_READY
constexpr uint8_t kStopWaiting = 0;  // WaitResponseType::STOP_WAITING

// A value the server sends back is at most this large (the store carries
// names, addresses and counters; a larger length is a broken stream).
constexpr uint64_t kMaxValueBytes = uint64_t{64} << 20;

// LibTorch's client puts this before every key; so do we, to share keys
// with processes that use it.
constexpr absl::string_view kKeyPrefix = "/";

std::string prefixed(absl::string_view key) {
  return absl::StrCat(kKeyPrefix, key);
}


// Bytes of one request, in the server's format.
class Request {
 public:
  explicit Request(Query query) { bytes_.push_back(static_cast<char>(query)); }
  Request& u64(uint64_t v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Request& i64(int64_t v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Request& str(absl::string_view s) {
    u64(s.size());
    bytes_.append(s.data(), s.size());
    return *this;
  }
  Request& vec(const std::vector<uint8_t>& v) {
    u64(v.size());
    bytes_.append(reinterpret_cast<const char*>(v.data()), v.size());
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Waits until `fd` is ready for `events` or `deadline` passes.
bool wait_ready(int fd, short events, absl::Time deadline) {
  for (;;) {
    int ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      ms = static_cast<int>(std::min<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
          1 << 30));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the read/write reports it
  }
}

}  // namespace

// A connected socket to host:port, retrying until `deadline` (the server
// may not listen yet); UNAVAILABLE naming the address and the last error.
absl::StatusOr<int> open_socket(const std::string& host, int port,
                                absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no address";
  absl::Duration backoff = absl::Milliseconds(10);
  for (;;) {
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), absl::StrCat(port).c_str(),
                                 &hints, &found);
    if (rc != 0) {
      last_error = absl::StrCat("cannot resolve '", host, "': ",
                                ::gai_strerror(rc));
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC,
                                a->ai_protocol);
        if (fd < 0) {
          last_error = std::strerror(errno);
          continue;
        }
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(found);
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return fd;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(found);
    }
    if (absl::Now() + backoff >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "cannot reach the rendezvous store at ", host, ":", port, ": ",
          last_error));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

absl::StatusOr<c10::intrusive_ptr<TcpStoreClient>> TcpStoreClient::connect(
    const std::string& host, int port, absl::Duration timeout) {
  const absl::Time deadline = timeout == absl::ZeroDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + timeout;
  absl::StatusOr<int> fd = open_socket(host, port, deadline);
  if (!fd.ok()) {
    return absl::UnavailableError(absl::StrCat(
        fd.status().message(), " (tried for ", absl::FormatDuration(timeout),
        ")"));
  }
  return c10::make_intrusive<TcpStoreClient>(Token{}, *fd, host, port,
                                             timeout);
}

TcpStoreClient::TcpStoreClient(Token, int fd, std::string host, int port,
                               absl::Duration timeout)
    : c10d::Store(std::chrono::milliseconds(
          timeout == absl::InfiniteDuration()
              ? 0
              : absl::ToInt64Milliseconds(timeout))),
      host_(std::move(host)),
      port_(port),
      address_(absl::StrCat(host_, ":", port_)),
      fd_(fd) {}

TcpStoreClient::~TcpStoreClient() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Time TcpStoreClient::deadline() const {
  absl::Duration timeout = request_timeout_;
  if (timeout_ != kNoTimeout) {
    timeout = std::min(timeout, absl::FromChrono(timeout_));
  }
  return absl::Now() + timeout;
}

void TcpStoreClient::set_request_timeout(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  request_timeout_ = std::max(timeout, kMinRequestTimeout);
}

void TcpStoreClient::fail(const std::string& what) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  broken_ = absl::StrCat("the rendezvous store at ", address_, " ", what);
  throw std::runtime_error(broken_);
}

void TcpStoreClient::write_all(const std::string& bytes, absl::Time deadline) {
  if (fd_ < 0) throw std::runtime_error(broken_);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd_, POLLOUT, deadline)) {
        fail("did not take a request in time (timeout)");
      }
      continue;
    }
    fail(absl::StrCat("is lost: ", std::strerror(errno)));
  }
}

void TcpStoreClient::read_exact(void* out, size_t n, absl::Time deadline) {
  if (fd_ < 0) throw std::runtime_error(broken_);
  auto* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::recv(fd_, p + done, n - done, MSG_DONTWAIT);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) fail("is lost: it closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd_, POLLIN, deadline)) {
        fail("did not answer in time (timeout)");
      }
      continue;
    }
    fail(absl::StrCat("is lost: ", std::strerror(errno)));
  }
}

std::vector<uint8_t> TcpStoreClient::read_vector(absl::Time deadline) {
  uint64_t size = 0;
  read_exact(&size, sizeof(size), deadline);
  if (size > kMaxValueBytes) {
    fail(absl::StrCat("sent a value of ", size, " bytes: not a store"));
  }
  std::vector<uint8_t> value(size);
  read_exact(value.data(), value.size(), deadline);
  return value;
}

void TcpStoreClient::set(const std::string& key,
                         const std::vector<uint8_t>& value) {
  absl::MutexLock lock(&mu_);
  write_all(Request(Query::kSet).str(prefixed(key)).vec(value).bytes(), deadline());
}

std::vector<uint8_t> TcpStoreClient::compareSet(
    const std::string& key, const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  absl::MutexLock lock(&mu_);
  const absl::Time until = deadline();
  write_all(
      Request(Query::kCompareSet).str(prefixed(key)).vec(expected).vec(desired).bytes(),
      until);
  return read_vector(until);
}

std::vector<uint8_t> TcpStoreClient::get(const std::string& key) {
  // The server fails (and drops the connection) on a GET of a missing key.
  wait_for({key}, absl::FromChrono(timeout_));
  absl::MutexLock lock(&mu_);
  const absl::Time until = deadline();
  write_all(Request(Query::kGet).str(prefixed(key)).bytes(), until);
  return read_vector(until);
}

int64_t TcpStoreClient::add(const std::string& key, int64_t value) {
  absl::MutexLock lock(&mu_);
  const absl::Time until = deadline();
  write_all(Request(Query::kAdd).str(prefixed(key)).i64(value).bytes(), until);
  int64_t sum = 0;
  read_exact(&sum, sizeof(sum), until);
  return sum;
}

bool TcpStoreClient::deleteKey(const std::string& key) {
  absl::MutexLock lock(&mu_);
  const absl::Time until = deadline();
  write_all(Request(Query::kDeleteKey).str(prefixed(key)).bytes(), until);
  int64_t deleted = 0;
  read_exact(&deleted, sizeof(deleted), until);
  return deleted == 1;
}

bool TcpStoreClient::check_locked(const std::vector<std::string>& keys) {
  const absl::Time until = deadline();
  Request request(Query::kCheck);
  request.u64(keys.size());
  for (const std::string& key : keys) request.str(prefixed(key));
  write_all(request.bytes(), until);
  uint8_t answer = 0;
  read_exact(&answer, 1, until);
  if (answer != kReady && answer != kNotReady) {
    fail(absl::StrCat("answered a check with ", int{answer}, ": not a store"));
  }
  return answer == kReady;
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  return check_locked(keys);
}

int64_t TcpStoreClient::getNumKeys() {
  absl::MutexLock lock(&mu_);
  const absl::Time until = deadline();
  write_all(Request(Query::kGetNumKeys).bytes(), until);
  int64_t n = 0;
  read_exact(&n, sizeof(n), until);
  return n;
}

void TcpStoreClient::wait(const std::vector<std::string>& keys) {
  wait_for(keys, absl::FromChrono(timeout_));
}

void TcpStoreClient::wait(const std::vector<std::string>& keys,
                          const std::chrono::milliseconds& timeout) {
  wait_for(keys, absl::FromChrono(timeout));
}

void TcpStoreClient::wait_for(const std::vector<std::string>& keys,
                              absl::Duration timeout) {
  const absl::Time until = timeout == absl::ZeroDuration()
                               ? absl::InfiniteFuture()
                               : absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  // The server answers a WAIT the moment the last key is set, so a waiter
  // hears of a key before its setter's next request (as with LibTorch's
  // client): a barrier's last worker may leave at once.
  Request request(Query::kWait);
  request.u64(keys.size());
  for (const std::string& key : keys) request.str(prefixed(key));
  write_all(request.bytes(), deadline());
  if (fd_ >= 0 && wait_ready(fd_, POLLIN, until)) {
    uint8_t answer = 0;
    read_exact(&answer, 1, deadline());
    if (answer != kStopWaiting) {
      fail(absl::StrCat("answered a wait with ", int{answer}, ": not a store"));
    }
    return;
  }
  // 1.13's server cannot cancel a WAIT: its late answer would be taken for
  // the answer of the next request. This connection is done; take another.
  ::close(fd_);
  fd_ = -1;
  absl::StatusOr<int> fresh =
      open_socket(host_, port_, absl::Now() + absl::FromChrono(timeout_));
  if (fresh.ok()) {
    fd_ = *fresh;
  } else {
    broken_ = std::string(fresh.status().message());
  }
  throw std::runtime_error(absl::StrCat(
      "Socket Timeout: waited ", absl::FormatDuration(timeout),
      " for keys at the rendezvous store at ", address_));
}

}  // namespace tether::internal
