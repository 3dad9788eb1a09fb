// Google Benchmark baseline of bare gRPC (Debian's 1.51, callback API, no
// tether): ping-pong round trips on loopback between a client and an echo
// server in this process, by message size, as unary calls and on one
// bidirectional stream. What the gRPC backend (BM_Grpc in agent_benchmark)
// is compared with in one process; tools/grpc_pingpong is the same between
// two processes (the bench's baseline).
//
//   bazel run -c opt //bench:grpc_baseline_benchmark
#include <absl/synchronization/notification.h>
#include <benchmark/benchmark.h>

#include <memory>

#include "tools/internal/grpc_echo.h"

namespace {

namespace echo = ::tether::bench::grpc_echo;

// An echo server on loopback and a stub of a channel to it.
struct Loopback {
  Loopback()
      : server(echo::start_server(&service, nullptr)),
        stub(echo::connect(server->port)) {}

  echo::EchoService service;
  std::unique_ptr<echo::Server> server;
  ::grpc::GenericStub stub;
};

void BM_GrpcUnaryPingPong(benchmark::State& state) {
  Loopback loopback;
  const ::grpc::ByteBuffer request = echo::message_of(state.range(0));
  for (auto _ : state) {
    ::grpc::ClientContext context;
    ::grpc::ByteBuffer response;
    absl::Notification done;
    ::grpc::Status status;
    loopback.stub.UnaryCall(&context, echo::kUnary, ::grpc::StubOptions(),
                            &request, &response, [&](::grpc::Status s) {
                              status = std::move(s);
                              done.Notify();
                            });
    done.WaitForNotification();
    if (!status.ok()) {
      state.SkipWithError(status.error_message().c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * 2 * state.range(0));
}

void BM_GrpcStreamPingPong(benchmark::State& state) {
  Loopback loopback;
  std::unique_ptr<echo::Pinger> stream = echo::callback_pinger(loopback.stub);
  const ::grpc::ByteBuffer request = echo::message_of(state.range(0));
  for (auto _ : state) {
    if (!stream->ping(request)) {
      state.SkipWithError("the stream broke");
      break;
    }
  }
  stream->close();
  state.SetBytesProcessed(state.iterations() * 2 * state.range(0));
}

#define SIZES ->Arg(0)->Arg(8 << 10)->Arg(1 << 20)->Arg(16 << 20)->UseRealTime()
BENCHMARK(BM_GrpcUnaryPingPong) SIZES;
BENCHMARK(BM_GrpcStreamPingPong) SIZES;

}  // namespace
