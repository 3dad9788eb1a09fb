// Google Benchmark suite of the agents: a request and its echoed response
// between two agents of one backend in this process (real transports for
// TensorPipe: uv and shm between the two agents; gRPC over loopback TCP;
// libfabric: tcp;ofi_rxm and shm endpoints), by message size.
// grpc_baseline_benchmark measures bare gRPC the same way.
//
//   bazel run -c opt //bench:agent_benchmark
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "backends/grpc/grpc_agent.h"
#include "backends/libfabric/libfabric_agent.h"
#include "backends/loopback/loopback_agent.h"
#include "backends/tensorpipe/tensorpipe_agent.h"
#include "testing/agent_testing.h"

namespace tether {
namespace {

using ::tether::testing::AgentGroup;

void round_trips(benchmark::State& state, const Backend& backend,
                 AgentGroup::Settings settings) {
  AgentGroup group(backend, 2, std::move(settings));
  if (!group.ok()) {
    state.SkipWithError("the agents did not start");
    return;
  }
  group.start_all(::tether::testing::echo);
  const size_t bytes = static_cast<size_t>(state.range(0));
  c10::Storage storage = ::tether::testing::make_storage(bytes, 1);
  for (auto _ : state) {
    Message request;
    request.type = MessageType::kPing;
    request.payload = "bench";
    if (bytes > 0) request.storages.push_back(storage);
    absl::StatusOr<Message> response =
        group[0].send(group[1].self(), std::move(request), absl::Seconds(30))
            .get();
    if (!response.ok()) {
      state.SkipWithError(response.status().ToString().c_str());
      break;
    }
  }
  // Both ways.
  state.SetBytesProcessed(state.iterations() * 2 * state.range(0));
}

void BM_Loopback(benchmark::State& state) {
  round_trips(state, backends::loopback_backend(), {});
}
void BM_TensorPipeUv(benchmark::State& state) {
  round_trips(state, backends::tensorpipe_backend(),
              {{"tensorpipe.transports", "uv"},
               {"tensorpipe.channels", "basic"}});
}
void BM_TensorPipeShm(benchmark::State& state) {
  round_trips(state, backends::tensorpipe_backend(),
              {{"tensorpipe.transports", "shm"},
               {"tensorpipe.channels", "basic"}});
}
void BM_TensorPipeNegotiated(benchmark::State& state) {
  round_trips(state, backends::tensorpipe_backend(), {});
}
void BM_Grpc(benchmark::State& state) {
  round_trips(state, backends::grpc_backend(), {});
}
void BM_LibfabricTcp(benchmark::State& state) {
  round_trips(state, backends::libfabric_backend(),
              {{"libfabric.provider", "tcp;ofi_rxm"}});
}
void BM_LibfabricShm(benchmark::State& state) {
  round_trips(state, backends::libfabric_backend(),
              {{"libfabric.provider", "shm"}});
}

#define SIZES ->Arg(0)->Arg(8 << 10)->Arg(1 << 20)->Arg(16 << 20)->UseRealTime()
BENCHMARK(BM_Loopback) SIZES;
BENCHMARK(BM_TensorPipeUv) SIZES;
BENCHMARK(BM_TensorPipeShm) SIZES;
BENCHMARK(BM_TensorPipeNegotiated) SIZES;
BENCHMARK(BM_Grpc) SIZES;
BENCHMARK(BM_LibfabricTcp) SIZES;
BENCHMARK(BM_LibfabricShm) SIZES;

}  // namespace
}  // namespace tether
