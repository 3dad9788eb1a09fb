// Soak (not in the default run): 4 worker processes mix calls,
// async fan-outs, RRefs passed between workers, remote modules and
// distributed autograd for TETHER_SOAK_SECONDS (default 600) over the
// faulty backend wrapping TensorPipe (or TETHER_SOAK_BACKEND: grpc,
// libfabric) with random delays on every message (faulty.jitter_ms), so
// messages overtake each other. Every result is
// checked; at the end each worker must have seen zero errors, and its private
// memory and thread count must be flat after the warm-up (Peaks below).
// TETHER_SOAK_OPS (e.g. "03") limits the mix to some operations: 0 rpc_sync,
// 1 async fan-out, 2 RRefs, 3 autograd chain, 4 remote module, 5 a large
// tensor each way (384 KiB to 3 MiB). TETHER_SOAK_BUSY_POLL_US sets
// RpcOptions::busy_poll (default 0).
//
//   bazel test //testing/soak:soak_test --test_output=streamed
//   bazel test //testing/soak:soak_test --test_env=TETHER_SOAK_SECONDS=120
//   bazel test //testing/soak:soak_test --test_env=TETHER_SOAK_BACKEND=grpc
//   bazel test //testing/soak:soak_test --test_env=TETHER_SOAK_BACKEND=libfabric
//       --test_env=TETHER_SOAK_SETTINGS=libfabric.provider=shm
//   bazel test //testing/soak:soak_test --test_env=TETHER_SOAK_BACKEND=grpc
//       --test_env=TETHER_SOAK_BUSY_POLL_US=100
#include <ATen/ATen.h>
#include <absl/random/random.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "autograd/autograd_testing.h"
#include "backends/builtin.h"
#include "backends/faulty/faulty_agent.h"
#include "core/rpc.h"
#include "rref/rref.h"
#include "rref/rref_testing.h"
#include "testing/multiprocess.h"
#include "testing/process_resources.h"
#include "testing/status_matchers.h"

namespace tether {
namespace {

using ::tether::testing::IsOk;

constexpr int kWorld = 4;

int64_t env_int(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoll(value) : fallback;
}

// What must stay flat after the warm-up: malloc's bytes in use (a leak of
// the heap shows there first), RssAnon (the process's own memory, which
// also holds what malloc does not count, and malloc's free memory its
// arenas keep) and the threads. RssShmem grows while TensorPipe's
// fixed-size shared-memory rings are first written through, up to their
// size; it is reported, not checked.
using ::tether::testing::malloc_in_use_kb;
using ::tether::testing::rss_anon_kb;
using ::tether::testing::status_kb;
using ::tether::testing::thread_count;

// The largest sample of the warm-up and after it. The large tensors in
// flight move the memory by tens of MB from one sample to the next, so the
// reference is the warm-up's peak; a leak keeps growing past every peak.
struct Peaks {
  int64_t warm = 0;
  int64_t after = 0;
  void add(int64_t sample, bool warmed) {
    int64_t& peak = warmed ? after : warm;
    peak = std::max(peak, sample);
  }
  // At most `percent` % and `slack` above the warm-up's peak.
  bool flat(int64_t percent, int64_t slack) const {
    return after <= warm + warm * percent / 100 + slack;
  }
};

std::string name_of(int rank) { return absl::StrCat("w", rank % kWorld); }

struct Soak {
  int rank;
  absl::BitGen random;
  int64_t ops = 0;
  int64_t errors = 0;

  void error(const std::string& what, const absl::Status& status) {
    ++errors;
    std::printf("error in %s: %s\n", what.c_str(), status.ToString().c_str());
  }

  std::string peer() {
    int other = absl::Uniform(random, 0, kWorld - 1);
    return name_of(other >= rank ? other + 1 : other);
  }

  void call() {
    absl::StatusOr<c10::IValue> r =
        rpc_sync(peer(), "aten::add.Tensor", {at::ones({4}), at::ones({4})});
    if (!r.ok()) return error("rpc_sync", r.status());
    if (!at::equal(r->toTensor(), at::full({4}, 2.0))) {
      error("rpc_sync", absl::InternalError("wrong sum"));
    }
  }

  // A large tensor each way (over the inline and payload limits: on
  // TensorPipe within a host, through the cma_write channel), of one of a
  // few sizes, as a model's repeated shapes are.
  void large() {
    static constexpr int64_t kFloats[] = {96 << 10, 256 << 10, 768 << 10};
    const int64_t floats = kFloats[absl::Uniform<size_t>(random, 0, 3)];
    const double base = absl::Uniform<int>(random, 0, 100);
    absl::StatusOr<c10::IValue> r = rpc_sync(
        peer(), "aten::add.Scalar", {at::full({floats}, base), 1.0});
    if (!r.ok()) return error("large", r.status());
    if (!at::equal(r->toTensor(), at::full({floats}, base + 1))) {
      error("large", absl::InternalError("wrong sum"));
    }
  }

  void fan_out() {
    std::vector<Future<c10::IValue>> calls;
    for (int i = 0; i < 16; ++i) {
      calls.push_back(rpc_async(peer(), "aten::mul.Scalar",
                                {at::ones({64}), static_cast<double>(i)}));
    }
    for (int i = 0; i < 16; ++i) {
      absl::StatusOr<c10::IValue> r = calls[i].get();
      if (!r.ok()) return error("rpc_async", r.status());
      if (r->toTensor().sum().item<double>() != 64.0 * i) {
        error("rpc_async", absl::InternalError("wrong product"));
      }
    }
  }

  void rrefs() {
    absl::StatusOr<RRef> r =
        remote(peer(), "aten::add.Tensor", {at::ones({3}), at::ones({3})});
    if (!r.ok()) return error("remote", r.status());
    absl::StatusOr<c10::IValue> here = r->to_here();
    if (!here.ok()) return error("to_here", here.status());
    // The RRef travels to a third worker, which reads it.
    absl::StatusOr<c10::IValue> there =
        rpc_sync(peer(), testing::kValueOf, {r->to_ivalue()});
    if (!there.ok()) return error("RRef passed on", there.status());
    if (!at::equal(there->toTensor(), at::full({3}, 2.0))) {
      error("RRef passed on", absl::InternalError("wrong value"));
    }
  }

  void autograd() {
    at::Tensor x = at::rand({8}).requires_grad_(true);
    at::Tensor w = at::rand({8}).requires_grad_(true);
    absl::StatusOr<autograd::Context> context = autograd::Context::enter();
    if (!context.ok()) return error("context", context.status());
    absl::StatusOr<c10::IValue> y =
        rpc_sync(peer(), testing::kMulVia, {peer(), x, w});
    if (!y.ok()) return error("autograd forward", y.status());
    absl::Status back =
        autograd::backward(context->id(), {y->toTensor().sum()});
    if (!back.ok()) return error("backward", back);
    absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> g =
        autograd::get_gradients(context->id());
    if (!g.ok()) return error("get_gradients", g.status());
    // y = 2x * w + x
    if (!at::allclose(g->at(x), w.detach() * 2 + 1) ||
        !at::allclose(g->at(w), x.detach() * 2)) {
      error("autograd", absl::InternalError("wrong gradients"));
    }
  }

  void module(const RRef& linear) {
    at::Tensor x = at::rand({2, 8}).requires_grad_(true);
    absl::StatusOr<autograd::Context> context = autograd::Context::enter();
    if (!context.ok()) return error("context", context.status());
    absl::StatusOr<c10::IValue> y = linear.rpc_sync().call("forward", {x});
    if (!y.ok()) return error("module forward", y.status());
    absl::Status back =
        autograd::backward(context->id(), {y->toTensor().sum()});
    if (!back.ok()) return error("module backward", back);
    absl::StatusOr<c10::Dict<at::Tensor, at::Tensor>> g =
        autograd::get_gradients(context->id());
    if (!g.ok() || !g->contains(x)) {
      error("module gradients", absl::InternalError("missing"));
    }
  }
};

TEST(Soak, MixedTrafficUnderRandomDelays) {
  const int64_t seconds = env_int("TETHER_SOAK_SECONDS", 600);
  ::tether::testing::run_in_processes(kWorld, [seconds](int rank, int world) {
    static BackendRegistry* registry = [] {
      auto* r = new BackendRegistry;
      EXPECT_THAT(backends::register_builtin_backends(*r), IsOk());
      return r;
    }();
    RpcOptions options;
    const char* backend_env = std::getenv("TETHER_SOAK_BACKEND");
    const std::string backend =
        backend_env != nullptr && *backend_env != '\0' ? backend_env
                                                        : "tensorpipe";
    // TETHER_SOAK_JITTER_MS=0: the plain backend, no injected delays.
    const int64_t jitter = env_int("TETHER_SOAK_JITTER_MS", 5);
    options.backend = jitter > 0 ? "faulty" : backend;
    if (jitter > 0) {
      options.backend_settings = {{"faulty.inner", backend},
                                  {"faulty.jitter_ms", absl::StrCat(jitter)}};
    }
    // TETHER_SOAK_SETTINGS ("libfabric.provider=shm,k=v"): the backend's
    // own settings.
    if (const char* extra = std::getenv("TETHER_SOAK_SETTINGS")) {
      for (absl::string_view pair :
           absl::StrSplit(extra, ',', absl::SkipEmpty())) {
        std::pair<std::string, std::string> kv =
            absl::StrSplit(pair, absl::MaxSplits('=', 1));
        options.backend_settings[kv.first] = kv.second;
      }
    }
    options.default_timeout = absl::Seconds(60);
    options.shutdown_timeout = absl::Seconds(120);
    options.busy_poll =
        absl::Microseconds(env_int("TETHER_SOAK_BUSY_POLL_US", 0));
    ASSERT_THAT(init_rpc(name_of(rank), rank, world, options, *registry,
                         {rref_extension(), autograd::autograd_extension()}),
                IsOk());
    Soak soak{rank};
    {
      absl::StatusOr<RRef> linear =
          remote(soak.peer(), testing::kLinear,
                 {int64_t{8}, int64_t{4}, int64_t{rank}});
      ASSERT_THAT(linear, IsOk());
      const absl::Time start = absl::Now();
      const absl::Time end = start + absl::Seconds(seconds);
      const absl::Time warm = start + absl::Seconds(seconds / 5);
      Peaks memory, in_use, threads;
      absl::Time next_sample = start;
      // TETHER_SOAK_OPS ("0,3"): only those operations (to find which one
      // a growth comes from).
      std::vector<int> kinds;
      for (char c : std::string(std::getenv("TETHER_SOAK_OPS") != nullptr
                                    ? std::getenv("TETHER_SOAK_OPS")
                                    : "012345")) {
        if (c >= '0' && c <= '5') kinds.push_back(c - '0');
      }
      while (absl::Now() < end) {
        switch (kinds[absl::Uniform<size_t>(soak.random, 0, kinds.size())]) {
          case 0: soak.call(); break;
          case 1: soak.fan_out(); break;
          case 2: soak.rrefs(); break;
          case 3: soak.autograd(); break;
          case 4: soak.module(*linear); break;
          case 5: soak.large(); break;
        }
        ++soak.ops;
        if (absl::Now() >= next_sample) {
          next_sample += absl::Seconds(10);
          const bool warmed = absl::Now() >= warm;
          const int64_t rss = rss_anon_kb();
          const int64_t allocated = malloc_in_use_kb();
          const int thread_now = thread_count();
          memory.add(rss, warmed);
          in_use.add(allocated, warmed);
          threads.add(thread_now, warmed);
          std::printf(
              "t=%4.0fs ops=%lld errors=%lld anon=%lld kB (malloc in use "
              "%lld kB) shmem=%lld kB threads=%d\n",
              absl::ToDoubleSeconds(absl::Now() - start),
              static_cast<long long>(soak.ops),
              static_cast<long long>(soak.errors),
              static_cast<long long>(rss), static_cast<long long>(allocated),
              static_cast<long long>(status_kb("RssShmem:")), thread_now);
          std::fflush(stdout);
        }
      }
      std::printf(
          "soak summary: %lld operations in %lld s, %lld errors; largest in "
          "the warm-up, then after it: malloc in use %lld, %lld kB; private "
          "memory (RssAnon) %lld, %lld kB; threads %lld, %lld; shared memory "
          "(RssShmem) %lld kB at the end\n",
          static_cast<long long>(soak.ops), static_cast<long long>(seconds),
          static_cast<long long>(soak.errors),
          static_cast<long long>(in_use.warm),
          static_cast<long long>(in_use.after),
          static_cast<long long>(memory.warm),
          static_cast<long long>(memory.after),
          static_cast<long long>(threads.warm),
          static_cast<long long>(threads.after),
          static_cast<long long>(status_kb("RssShmem:")));
      const backends::InjectedFaults faults = backends::injected_faults();
      std::printf("faults injected: %lld sends delayed by 0 to %lld ms\n",
                  static_cast<long long>(faults.delayed),
                  static_cast<long long>(jitter));
      EXPECT_EQ(soak.errors, 0);
      // malloc's bytes in use: 10 % + 8 MiB. RssAnon: 25 % + 16 MiB, for
      // the free memory malloc's arenas keep after multi-MiB tensors were
      // freed on many threads. Threads: 4 more at most.
      EXPECT_TRUE(in_use.flat(10, 8 * 1024))
          << "malloc in use grew: " << in_use.warm << " -> " << in_use.after;
      EXPECT_TRUE(memory.flat(25, 16 * 1024))
          << "RssAnon grew: " << memory.warm << " -> " << memory.after;
      EXPECT_TRUE(threads.flat(0, 4))
          << "threads grew: " << threads.warm << " -> " << threads.after;
    }
    EXPECT_THAT(shutdown(), IsOk());
  }, absl::Seconds(seconds + 300));
}

}  // namespace
}  // namespace tether
