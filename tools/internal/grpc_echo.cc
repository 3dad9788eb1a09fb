// Bare gRPC echo server and clients (grpc_echo.h).
#include "tools/internal/grpc_echo.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include <utility>

namespace tether::bench::grpc_echo {
namespace {

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

class CallbackPinger final
    : public Pinger,
      public ::grpc::ClientBidiReactor<::grpc::ByteBuffer, ::grpc::ByteBuffer> {
 public:
  explicit CallbackPinger(::grpc::GenericStub& stub) {
    stub.PrepareBidiStreamingCall(&context_, kStream, ::grpc::StubOptions(),
                                  this);
    StartCall();
  }

  bool ping(const ::grpc::ByteBuffer& message) override {
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

  void close() override {
    StartWritesDone();
    done_.WaitForNotification();
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    (ok ? echoed_ : failed_) = true;
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    (ok ? written_ : failed_) = true;
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

// Tags are the addresses of these; each operation's completion is awaited
// before the next of its kind starts.
enum Op : int { kStart, kRead, kWrite, kWritesDone, kFinish };
int kTags[] = {kStart, kRead, kWrite, kWritesDone, kFinish};
void* tag(Op op) { return &kTags[op]; }

class QueuePinger final : public Pinger {
 public:
  explicit QueuePinger(::grpc::GenericStub& stub)
      : call_(stub.PrepareCall(&context_, kStream, &queue_)) {
    call_->StartCall(tag(kStart));
    ok_ = await(1);
  }
  ~QueuePinger() override {
    queue_.Shutdown();
    void* ignored_tag;
    bool ignored_ok;
    while (queue_.Next(&ignored_tag, &ignored_ok)) {
    }
  }

  bool ping(const ::grpc::ByteBuffer& message) override {
    if (!ok_) return false;
    call_->Read(&response_, tag(kRead));
    call_->Write(message, tag(kWrite));
    ok_ = await(2);
    return ok_;
  }

  void close() override {
    call_->WritesDone(tag(kWritesDone));
    await(1);
    ::grpc::Status status;
    call_->Finish(&status, tag(kFinish));
    await(1);
  }

 private:
  // Drives the queue until `count` operations have completed; false if one
  // failed.
  bool await(int count) {
    bool all_ok = true;
    for (; count > 0; --count) {
      void* got = nullptr;
      bool ok = false;
      if (!queue_.Next(&got, &ok)) return false;
      all_ok = all_ok && ok;
    }
    return all_ok;
  }

  ::grpc::ClientContext context_;
  ::grpc::CompletionQueue queue_;
  std::unique_ptr<::grpc::GenericClientAsyncReaderWriter> call_;
  ::grpc::ByteBuffer response_;
  bool ok_ = false;
};

bool next(::grpc::ServerCompletionQueue& queue) {
  void* got = nullptr;
  bool ok = false;
  return queue.Next(&got, &ok) && ok;
}

}  // namespace

::grpc::ServerGenericBidiReactor* EchoService::CreateReactor(
    ::grpc::GenericCallbackServerContext* context) {
  if (context->method() == kStream) return new EchoStream();
  return new EchoOnce();
}

Server::~Server() {
  if (server) server->Shutdown();
  if (queue) {
    queue->Shutdown();
    void* ignored_tag;
    bool ignored_ok;
    while (queue->Next(&ignored_tag, &ignored_ok)) {
    }
  }
}

std::unique_ptr<Server> start_server(EchoService* callback,
                                     ::grpc::AsyncGenericService* async) {
  auto out = std::make_unique<Server>();
  ::grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", ::grpc::InsecureServerCredentials(),
                           &out->port);
  if (callback != nullptr) {
    builder.RegisterCallbackGenericService(callback);
  } else {
    builder.RegisterAsyncGenericService(async);
    out->queue = builder.AddCompletionQueue();
  }
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  out->server = builder.BuildAndStart();
  return out;
}

std::shared_ptr<::grpc::Channel> connect(int port) {
  ::grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  return ::grpc::CreateCustomChannel("ipv4:127.0.0.1:" + std::to_string(port),
                                     ::grpc::InsecureChannelCredentials(),
                                     args);
}

::grpc::ByteBuffer message_of(size_t bytes) {
  ::grpc::Slice slice(std::string(bytes, 'x'));
  return ::grpc::ByteBuffer(&slice, 1);
}

bool serve_one_stream(::grpc::AsyncGenericService& service,
                      ::grpc::ServerCompletionQueue& queue) {
  ::grpc::GenericServerContext context;
  ::grpc::GenericServerAsyncReaderWriter stream(&context);
  service.RequestCall(&context, &stream, &queue, &queue, tag(kStart));
  if (!next(queue)) return false;
  ::grpc::ByteBuffer buffer;
  for (;;) {
    stream.Read(&buffer, tag(kRead));
    if (!next(queue)) break;  // the client closed its side
    stream.Write(buffer, tag(kWrite));
    if (!next(queue)) return false;
  }
  stream.Finish(::grpc::Status::OK, tag(kFinish));
  return next(queue);
}

std::unique_ptr<Pinger> callback_pinger(::grpc::GenericStub& stub) {
  return std::make_unique<CallbackPinger>(stub);
}

std::unique_ptr<Pinger> queue_pinger(::grpc::GenericStub& stub) {
  return std::make_unique<QueuePinger>(stub);
}

}  // namespace tether::bench::grpc_echo
