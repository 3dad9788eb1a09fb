// Raw baselines: what two processes get without tether, measured by
// the benchmark tools (tools/bench_worker.cc --raw, tools/rpc_latency.cc) in
// the same run as tether's own numbers, so each backend is shown as a ratio
// to its own limit.
//
// - TCP ping-pong: rank 0 sends N bytes on one TCP connection (TCP_NODELAY;
//   loopback, or between two hosts), rank 1 sends them back; per
//   round-trip samples.
// - TCP stream: rank 0 writes a stream of chunks, rank 1 reads it and
//   acknowledges the end with one byte; one-way GB/s.
// - memcpy: one thread copying a buffer of N bytes (what shared memory and
//   cross-memory attach copy at best, once per direction); and the same
//   into a freshly allocated buffer, which pays the page faults a receiver
//   pays when it allocates each incoming tensor anew.
//
// Thread safety: a TcpPair is used by one thread.
#ifndef TETHER_TOOLS_INTERNAL_RAW_BASELINES_H_
#define TETHER_TOOLS_INTERNAL_RAW_BASELINES_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstddef>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace tether::bench {

// One connected TCP socket between rank 0 and rank 1 of a pair of
// processes: rank 1 listens on listen_address() (tools/internal/
// launcher_env.h: 127.0.0.1 on one machine, its own address across hosts),
// rank 0 connects.
class TcpPair {
 public:
  // Rank 1 listens on a port the kernel picks and publishes its address and
  // port in `store`;
  // rank 0 waits up to `timeout` for it and connects.
  [[nodiscard]] static absl::StatusOr<TcpPair> connect(int rank,
                                                       c10d::Store& store,
                                                       absl::Duration timeout);
  TcpPair(TcpPair&& other) noexcept;
  TcpPair& operator=(TcpPair&& other) noexcept;
  TcpPair(const TcpPair&) = delete;
  TcpPair& operator=(const TcpPair&) = delete;
  ~TcpPair();

  int rank() const { return rank_; }

  // Blocking; UNAVAILABLE when the peer has gone.
  [[nodiscard]] absl::Status send_all(const char* data, size_t bytes);
  [[nodiscard]] absl::Status recv_all(char* data, size_t bytes);

 private:
  TcpPair(int rank, int fd) : rank_(rank), fd_(fd) {}
  int rank_ = 0;
  int fd_ = -1;
};

// `warmup` + `iterations` round trips of `bytes` each way. Rank 0 times
// each timed round trip into `samples_us`; rank 1 echoes.
[[nodiscard]] absl::Status tcp_ping_pong(TcpPair& pair, size_t bytes,
                                         int warmup, int iterations,
                                         std::vector<double>& samples_us);

// `total` bytes from rank 0 to rank 1 in writes of `chunk` bytes; rank 0
// returns the one-way GB/s up to rank 1's acknowledgement (rank 1: 0).
[[nodiscard]] absl::StatusOr<double> tcp_stream(TcpPair& pair, size_t total,
                                                size_t chunk);

// The median GB/s of `iterations` single-thread copies of `bytes`, into one
// reused buffer or (`fresh`) into a buffer allocated for each copy; from
// (and into the reused) memory on 4 KiB pages, or on transparent huge pages
// (`huge_pages`), as tensors are with THP_MEM_ALLOC_ENABLE=1.
double memcpy_gbps(size_t bytes, int iterations, bool fresh = false,
                   bool huge_pages = false);

}  // namespace tether::bench

#endif  // TETHER_TOOLS_INTERNAL_RAW_BASELINES_H_
