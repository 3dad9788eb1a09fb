// cma_copy: what a cross-memory copy between two processes of this machine
// costs, by who copies and by the pages on each side.
//
//   bazel build -c opt //tools:cma_copy
//   bazel-bin/tools/cma_copy [--bytes=67108864] [--rounds=21]
//
// A sender process holds a source buffer, on 4 KiB pages (as LibTorch
// allocates a tensor) or on transparent huge pages (as with
// THP_MEM_ALLOC_ENABLE=1); a receiver process holds a destination on huge
// pages (as tether's receive buffers are, core/toolkit/receive_buffers.h).
// Timed, median of the rounds (GB/s):
//   - readv: the receiver reads with process_vm_readv(), as TensorPipe's
//     `cma` channel does; the kernel pins the sender's pages first;
//   - writev: the sender writes with process_vm_writev(); the kernel pins
//     the receiver's pages (docs/benchmarks.md, "64 MiB: who copies");
//   - memcpy: within the sender, from the source into a buffer on huge
//     pages (the bench's memcpy baselines are of the same kinds).
// Both processes are forked from this one and stop at the end. No tether
// code is on the path.
#include <absl/strings/numbers.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/toolkit/huge_page_memory.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// A buffer of `n` bytes, every page touched: on huge pages, or on 4 KiB
// pages (advised not to use huge ones).
char* buffer(size_t n, bool huge) {
  void* p = nullptr;
  if (huge) {
    p = tether::internal::allocate_on_huge_pages(n);
    if (p == nullptr) die("allocate_on_huge_pages");
  } else {
    p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
               -1, 0);
    if (p == MAP_FAILED) die("mmap");
    ::madvise(p, n, MADV_NOHUGEPAGE);
  }
  std::memset(p, 1, n);
  return static_cast<char*>(p);
}

template <class T>
void put(int fd, const T& v) {
  if (::write(fd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) die("write");
}

template <class T>
T take(int fd) {
  T v;
  if (::read(fd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) die("read");
  return v;
}

struct Result {
  double readv_gbps = 0;
  double writev_gbps = 0;
  double memcpy_gbps = 0;
};

// One pair of processes; the source on huge pages or not.
Result measure(size_t bytes, int rounds, bool source_huge) {
  int to_sender[2];
  int to_receiver[2];
  if (::pipe(to_sender) != 0 || ::pipe(to_receiver) != 0) die("pipe");
  const pid_t sender = ::fork();
  if (sender < 0) die("fork");
  if (sender == 0) {
    char* source = buffer(bytes, source_huge);
    put(to_receiver[1], source);
    char* destination = take<char*>(to_sender[0]);
    std::vector<double> writes;
    for (int i = 0; i < rounds; ++i) {
      take<char>(to_sender[0]);  // the receiver's read is done
      iovec local{source, bytes};
      iovec remote{destination, bytes};
      const double start = now_s();
      if (::process_vm_writev(::getppid(), &local, 1, &remote, 1, 0) !=
          static_cast<ssize_t>(bytes)) {
        die("process_vm_writev");
      }
      writes.push_back(now_s() - start);
      put(to_receiver[1], 'w');
    }
    char* copy = buffer(bytes, /*huge=*/true);
    std::vector<double> copies;
    for (int i = 0; i < rounds; ++i) {
      const double start = now_s();
      std::memcpy(copy, source, bytes);
      copies.push_back(now_s() - start);
    }
    put(to_receiver[1], median(writes));
    put(to_receiver[1], median(copies));
    std::_Exit(0);
  }
  char* destination = buffer(bytes, /*huge=*/true);
  char* source = take<char*>(to_receiver[0]);
  put(to_sender[1], destination);
  std::vector<double> reads;
  for (int i = 0; i < rounds; ++i) {
    iovec local{destination, bytes};
    iovec remote{source, bytes};
    const double start = now_s();
    if (::process_vm_readv(sender, &local, 1, &remote, 1, 0) !=
        static_cast<ssize_t>(bytes)) {
      die("process_vm_readv");
    }
    reads.push_back(now_s() - start);
    put(to_sender[1], 'r');
    take<char>(to_receiver[0]);
  }
  const double write_s = take<double>(to_receiver[0]);
  const double copy_s = take<double>(to_receiver[0]);
  int status = 0;
  ::waitpid(sender, &status, 0);
  for (int fd : {to_sender[0], to_sender[1], to_receiver[0], to_receiver[1]}) {
    ::close(fd);
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  return Result{gb / median(reads), gb / write_s, gb / copy_s};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t bytes = int64_t{64} << 20;
  int rounds = 21;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--bytes=", 0) == 0 &&
        absl::SimpleAtoi(arg.substr(8), &bytes) && bytes > 0) {
      continue;
    }
    if (arg.rfind("--rounds=", 0) == 0 &&
        absl::SimpleAtoi(arg.substr(9), &rounds) && rounds > 0) {
      continue;
    }
    std::fprintf(stderr, "usage: cma_copy [--bytes=N] [--rounds=N]\n");
    return 2;
  }
  std::printf("%lld bytes into a receiver's buffer on huge pages, median of %d "
              "(GB/s)\n",
              static_cast<long long>(bytes), rounds);
  std::printf("%-22s %10s %10s %10s\n", "source pages", "readv", "writev",
              "memcpy");
  for (bool huge : {false, true}) {
    const Result r = measure(static_cast<size_t>(bytes), rounds, huge);
    std::printf("%-22s %10.2f %10.2f %10.2f\n", huge ? "huge" : "4 KiB",
                r.readv_gbps, r.writev_gbps, r.memcpy_gbps);
  }
  return 0;
}
