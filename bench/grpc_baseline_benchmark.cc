// Google Benchmark baseline of bare gRPC (Debian's 1.51, callback API, no
// tether): ping-pong round trips on loopback between a client and an echo
// server in this process, by message size, as unary calls and on one
// bidirectional stream. What the gRPC backend (BM_Grpc in agent_benchmark)
// is compared with: the library's own limit on this machine.
//
//   bazel run -c opt //bench:grpc_baseline_benchmark
#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <benchmark/benchmark.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>

#include <memory>
#include <string>
#include <vector>

namespace {

constexpr char kUnary[] = "/bench.Echo/Unary";
constexpr char kStream[] = "/bench.Echo/Stream";
constexpr int kMaxMessage = 64 << 20;

// Echoes every message of a stream back on it.
class EchoStream final : public ::grpc::ServerGenericBidiReactor {
 public:
  EchoStream() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(::grpc::Status::OK);
      return;
    }
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(::grpc::Status::OK);
      return;
    }
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }

 private:
  ::grpc::ByteBuffer buffer_;
};

// A unary call on a generic service is a stream of one message each way.
class EchoOnce final : public ::grpc::ServerGenericBidiReactor {
 public:
  EchoOnce() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(::grpc::Status::OK);
      return;
    }
    StartWriteAndFinish(&buffer_, ::grpc::WriteOptions(), ::grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  ::grpc::ByteBuffer buffer_;
};

class EchoService final : public ::grpc::CallbackGenericService {
 public:
  ::grpc::ServerGenericBidiReactor* CreateReactor(
      ::grpc::GenericCallbackServerContext* context) override {
    if (context->method() == kStream) return new EchoStream();
    return new EchoOnce();
  }
};

// An echo server on loopback and a channel to it.
struct Loopback {
  Loopback() {
    ::grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", ::grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterCallbackGenericService(&service);
    builder.SetMaxReceiveMessageSize(kMaxMessage);
    builder.SetMaxSendMessageSize(kMaxMessage);
    server = builder.BuildAndStart();
    ::grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessage);
    args.SetMaxSendMessageSize(kMaxMessage);
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    channel =
        ::grpc::CreateCustomChannel("ipv4:127.0.0.1:" + std::to_string(port),
                                    ::grpc::InsecureChannelCredentials(), args);
  }
  ~Loopback() { server->Shutdown(); }

  EchoService service;
  std::unique_ptr<::grpc::Server> server;
  std::shared_ptr<::grpc::Channel> channel;
};

::grpc::ByteBuffer message_of(size_t bytes) {
  ::grpc::Slice slice(std::string(bytes, 'x'));
  return ::grpc::ByteBuffer(&slice, 1);
}

void BM_GrpcUnaryPingPong(benchmark::State& state) {
  Loopback loopback;
  ::grpc::GenericStub stub(loopback.channel);
  const ::grpc::ByteBuffer request = message_of(state.range(0));
  for (auto _ : state) {
    ::grpc::ClientContext context;
    ::grpc::ByteBuffer response;
    absl::Notification done;
    ::grpc::Status status;
    stub.UnaryCall(&context, kUnary, ::grpc::StubOptions(), &request, &response,
                   [&](::grpc::Status s) {
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

// One bidirectional stream; ping() writes a message and waits for its echo
// (and for the write's own completion, which may come after the echo: only
// then may the next write start).
class PingStream final
    : public ::grpc::ClientBidiReactor<::grpc::ByteBuffer, ::grpc::ByteBuffer> {
 public:
  explicit PingStream(::grpc::GenericStub& stub) {
    stub.PrepareBidiStreamingCall(&context_, kStream, ::grpc::StubOptions(),
                                  this);
    StartCall();
  }

  bool ping(const ::grpc::ByteBuffer& message) {
    {
      absl::MutexLock lock(&mu_);
      echoed_ = false;
      written_ = false;
    }
    StartRead(&response_);
    StartWrite(&message);
    absl::MutexLock lock(&mu_);
    auto back = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (echoed_ && written_) || failed_;
    };
    mu_.Await(absl::Condition(&back));
    return !failed_;
  }

  void close() {
    StartWritesDone();
    done_.WaitForNotification();
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (ok) {
      echoed_ = true;
    } else {
      failed_ = true;
    }
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (ok) {
      written_ = true;
    } else {
      failed_ = true;
    }
  }
  void OnDone(const ::grpc::Status&) override { done_.Notify(); }

 private:
  ::grpc::ClientContext context_;
  ::grpc::ByteBuffer response_;
  absl::Mutex mu_;
  bool echoed_ ABSL_GUARDED_BY(mu_) = false;
  bool written_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification done_;
};

void BM_GrpcStreamPingPong(benchmark::State& state) {
  Loopback loopback;
  ::grpc::GenericStub stub(loopback.channel);
  PingStream stream(stub);
  const ::grpc::ByteBuffer request = message_of(state.range(0));
  for (auto _ : state) {
    if (!stream.ping(request)) {
      state.SkipWithError("the stream broke");
      break;
    }
  }
  stream.close();
  state.SetBytesProcessed(state.iterations() * 2 * state.range(0));
}

#define SIZES ->Arg(0)->Arg(8 << 10)->Arg(1 << 20)->Arg(16 << 20)->UseRealTime()
BENCHMARK(BM_GrpcUnaryPingPong) SIZES;
BENCHMARK(BM_GrpcStreamPingPong) SIZES;

}  // namespace
