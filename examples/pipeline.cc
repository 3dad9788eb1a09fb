// A model-parallel pipeline across worker processes on the default backend.
//
// Run by the launcher, which sets RANK, WORLD_SIZE and MASTER_ADDR/PORT:
//
//   bazel run //examples:run_pipeline -- --nproc 3
//
// Rank 0 is the driver; every other rank holds one layer of an MLP (its
// weights are made from a fixed seed, so the driver can recompute them) and
// serves it as a TorchScript function compiled at init. The driver pushes
// micro-batches through the stages with rpc_async, several in flight, checks
// every output against the same network run locally, and prints progress and
// a summary. examples/train.cc is the training counterpart (the README's
// main job).
#include <ATen/ATen.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <cstring>
#include <string>
#include <vector>

#include "backends/builtin.h"
#include "core/rendezvous.h"
#include "core/rpc.h"

namespace {

constexpr int64_t kWidth = 256;
constexpr int64_t kBatch = 64;

constexpr char kStageScript[] = R"(
def stage(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(torch.addmm(b, x, w))
)";

// Layer `layer`'s weights: the same on the stage that serves it and on the
// driver that checks it.
std::pair<at::Tensor, at::Tensor> layer_weights(int layer) {
  at::manual_seed(1000 + layer);
  return {at::randn({kWidth, kWidth}) / 16.0, at::randn({kWidth}) / 16.0};
}

struct Flags {
  int batches = 200;
  int in_flight = 8;
  std::string backend = "tensorpipe";
};

bool parse_flags(int argc, char** argv, Flags& flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      size_t n = std::strlen(name);
      if (arg.compare(0, n, name) == 0 && arg.size() > n && arg[n] == '=') {
        return argv[i] + n + 1;
      }
      return nullptr;
    };
    if (const char* v = value("--batches")) {
      if (!absl::SimpleAtoi(v, &flags.batches) || flags.batches < 1) return false;
    } else if (const char* v = value("--in_flight")) {
      if (!absl::SimpleAtoi(v, &flags.in_flight) || flags.in_flight < 1) return false;
    } else if (const char* v = value("--backend")) {
      flags.backend = v;
    } else {
      return false;
    }
  }
  return true;
}

int fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

int drive(int world_size, const Flags& flags) {
  const int stages = world_size - 1;
  std::vector<std::pair<at::Tensor, at::Tensor>> weights;
  for (int layer = 0; layer < stages; ++layer) weights.push_back(layer_weights(layer));
  at::manual_seed(7);
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < flags.batches; ++i) inputs.push_back(at::randn({kBatch, kWidth}));

  // Runs micro-batch `i` through every stage, one rpc_async per hop.
  auto run_batch = [&](int i) -> tether::Future<c10::IValue> {
    tether::Future<c10::IValue> h =
        tether::Future<c10::IValue>::ready(c10::IValue(inputs[i]));
    for (int layer = 0; layer < stages; ++layer) {
      absl::StatusOr<c10::IValue> x = h.get();
      if (!x.ok()) return h;
      h = tether::rpc_async(layer + 1, "stage",
                            {x->toTensor(), weights[layer].first,
                             weights[layer].second});
    }
    return h;
  };

  const absl::Time start = absl::Now();
  int checked = 0;
  double max_error = 0;
  std::vector<std::thread> lanes;
  std::vector<absl::Status> lane_errors(flags.in_flight);
  absl::Mutex mu;
  int next = 0;
  for (int lane = 0; lane < flags.in_flight; ++lane) {
    lanes.emplace_back([&, lane] {
      for (;;) {
        int i;
        {
          absl::MutexLock lock(&mu);
          if (next >= flags.batches) return;
          i = next++;
        }
        absl::StatusOr<c10::IValue> out = run_batch(i).get();
        if (!out.ok()) {
          lane_errors[lane] = out.status();
          return;
        }
        at::Tensor expected = inputs[i];
        for (const auto& [w, b] : weights) expected = at::relu(at::addmm(b, expected, w));
        double error = (out->toTensor() - expected).abs().max().item<double>();
        absl::MutexLock lock(&mu);
        max_error = std::max(max_error, error);
        ++checked;
        // One line per tenth: readable through the launcher's prefixes.
        if (checked % std::max(1, flags.batches / 10) == 0 ||
            checked == flags.batches) {
          double seconds = absl::ToDoubleSeconds(absl::Now() - start);
          std::printf("[%-20s] %4d/%d batches  %7.1f batches/s\n",
                      std::string(20 * checked / flags.batches, '#').c_str(),
                      checked, flags.batches, checked / seconds);
          std::fflush(stdout);
        }
      }
    });
  }
  for (auto& lane : lanes) lane.join();
  for (const absl::Status& error : lane_errors) {
    if (!error.ok()) return fail("pipeline", error);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const bool ok = max_error < 1e-4;
  std::printf(
      "summary: %d micro-batches of %lldx%lld through %d stages on %s in "
      "%.2f s (%.1f batches/s, %d in flight); max |error| vs local %.2e: "
      "%s\n",
      checked, static_cast<long long>(kBatch), static_cast<long long>(kWidth),
      stages, flags.backend.c_str(), seconds, checked / seconds,
      flags.in_flight, max_error, ok ? "matches local" : "MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!parse_flags(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: pipeline [--batches=N] [--in_flight=N] "
                 "[--backend=NAME]\n(run under tools/tether_run, which sets "
                 "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)\n");
    return 2;
  }
  tether::BackendRegistry registry;
  if (absl::Status s = tether::backends::register_builtin_backends(registry); !s.ok()) {
    return fail("registry", s);
  }
  tether::RpcOptions options;
  options.backend = flags.backend;
  options.init_method = "env://";
  options.scripts = {kStageScript};
  absl::StatusOr<tether::LauncherEnv> launched = tether::launcher_env();
  if (!launched.ok()) return fail("launcher", launched.status());
  const int rank = launched->rank;
  absl::Status up = tether::init_rpc(
      rank == 0 ? "driver" : absl::StrCat("stage", rank), -1, -1, options,
      registry);
  if (!up.ok()) return fail("init_rpc", up);
  absl::StatusOr<std::vector<tether::WorkerInfo>> all =
      tether::get_all_worker_infos();
  if (!all.ok()) return fail("workers", all.status());
  int code = 0;
  if (rank == 0) {
    if (all->size() < 2) {
      std::fprintf(stderr, "pipeline needs at least 2 processes (--nproc 2)\n");
      code = 2;
    } else {
      code = drive(static_cast<int>(all->size()), flags);
    }
  }
  // Stages serve until the driver is done: graceful shutdown is the barrier.
  absl::Status down = tether::shutdown();
  if (!down.ok()) return fail("shutdown", down);
  return code;
}
