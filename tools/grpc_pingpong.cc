// grpc_pingpong: bare gRPC ping-pong between two processes, the library's
// own limit to compare the grpc backend with, as the backend runs (the
// bench's "bare gRPC" baseline; bench/grpc_baseline_benchmark is the same
// within one process).
//
//   bazel build -c opt //tools:tether_run //tools:grpc_pingpong
//   bazel-bin/tools/tether_run --nproc 2 -- bazel-bin/tools/grpc_pingpong
//       [--api=callback|queue] [--iterations=N] [--quick] [--max_bytes=N]
//
// Rank 1 serves an echo of one bidirectional stream on 127.0.0.1 and tells
// rank 0 its port through the launcher's store; rank 0 writes a message of
// each size (8 B to 64 MiB, up to --max_bytes) and waits for its echo, with
// no tether code on the data path (tools/internal/grpc_echo.h).
// --api=callback (the default) uses gRPC's callback API on both sides, as
// the backend does (backends/grpc/internal/link.h): gRPC's own threads run
// every reaction. --api=queue uses completion queues that the client's
// calling thread and the server's main thread drive themselves.
// Prints a table and one JSON line (rank 0), with the "p50_us" (smallest
// size) and "sweep" rows tools/bench.py reads.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tools/internal/grpc_echo.h"
#include "tools/internal/launcher_env.h"
#include "tools/internal/pingpong.h"

namespace {

namespace echo = ::tether::bench::grpc_echo;
using ::tether::bench::Latency;
using ::tether::bench::PingPongFlags;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "grpc_pingpong: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string api = "callback";
  PingPongFlags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--api=callback" || arg == "--api=queue") {
      api = arg.substr(6);
    } else if (!flags.parse(arg)) {
      std::fprintf(stderr, "usage: grpc_pingpong [--api=callback|queue] %s\n",
                   PingPongFlags::kUsage);
      return 2;
    }
  }
  const tether::LauncherEnv env = tether::bench::launched("grpc_pingpong");
  if (env.world_size != 2) die("run with --nproc 2");
  std::unique_ptr<c10d::TCPStore> store =
      tether::bench::launcher_store("grpc_pingpong", env.rank);

  if (env.rank == 1) {
    echo::EchoService callback;
    ::grpc::AsyncGenericService async;
    std::unique_ptr<echo::Server> server =
        echo::start_server(api == "callback" ? &callback : nullptr, &async);
    if (server->server == nullptr) die("the server did not start");
    const std::string port = absl::StrCat(server->port);
    store->set("port", std::vector<uint8_t>(port.begin(), port.end()));
    if (api == "queue" && !echo::serve_one_stream(async, *server->queue)) {
      die("the served stream broke");
    }
    // Rank 0 may serve the store: stay until it has read everything.
    store->get("done");
    return 0;
  }

  const std::vector<uint8_t> text = store->get("port");
  int port = 0;
  if (!absl::SimpleAtoi(std::string(text.begin(), text.end()), &port)) {
    die("no port from rank 1");
  }
  ::grpc::GenericStub stub(echo::connect(port));
  std::unique_ptr<echo::Pinger> pinger = api == "callback"
                                             ? echo::callback_pinger(stub)
                                             : echo::queue_pinger(stub);
  std::vector<Latency> latencies;
  for (size_t size : flags.sizes()) {
    const ::grpc::ByteBuffer message = echo::message_of(size);
    latencies.push_back(
        tether::bench::time_round_trips(size, flags.rounds_of(size), [&] {
          if (!pinger->ping(message)) {
            die(absl::StrCat("the stream broke at ", size, " bytes"));
          }
        }));
  }
  pinger->close();
  store->set("done", {1});

  std::printf("bare gRPC, %s API, one stream, between two processes\n",
              api.c_str());
  tether::bench::print_latencies(latencies);
  std::printf("JSON {\"api\": \"%s\", %s}\n", api.c_str(),
              tether::bench::sweep_json(latencies).c_str());
  return 0;
}
