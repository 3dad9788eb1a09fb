// Bare gRPC on loopback, no tether (Debian's gRPC 1.51): an echo server and
// the clients that ping it, the grpc backend's raw baselines. Used by
// bench/grpc_baseline_benchmark (client and server in one process) and
// tools/grpc_pingpong (two processes, as the backend runs).
//
// The server echoes every message of a bidirectional stream (method
// kStream) back on it, and answers a unary call (kUnary) with its request.
// It serves through the callback API, as the backend does
// (backends/grpc/internal/link.h), or through a completion queue that a
// thread of the caller drives (AsyncEcho).
#ifndef TETHER_TOOLS_INTERNAL_GRPC_ECHO_H_
#define TETHER_TOOLS_INTERNAL_GRPC_ECHO_H_

#include <absl/synchronization/mutex.h>
#include <absl/synchronization/notification.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/server.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>

#include <cstddef>
#include <memory>
#include <string>

namespace tether::bench::grpc_echo {

inline constexpr char kUnary[] = "/bench.Echo/Unary";
inline constexpr char kStream[] = "/bench.Echo/Stream";

// Echoes through the callback API.
class EchoService final : public ::grpc::CallbackGenericService {
 public:
  ::grpc::ServerGenericBidiReactor* CreateReactor(
      ::grpc::GenericCallbackServerContext* context) override;
};

// A server on 127.0.0.1 at an ephemeral port, with no message size limit,
// serving `callback` or (when null) `async`, whose completion queue is
// returned in `queue`.
// The destructor shuts both down.
struct Server {
  ~Server();
  std::unique_ptr<::grpc::Server> server;
  std::unique_ptr<::grpc::ServerCompletionQueue> queue;
  int port = 0;
};
std::unique_ptr<Server> start_server(EchoService* callback,
                                     ::grpc::AsyncGenericService* async);

// A channel to 127.0.0.1:`port`, with no message size limit.
std::shared_ptr<::grpc::Channel> connect(int port);

::grpc::ByteBuffer message_of(size_t bytes);

// Serves one stream of kStream on `server`'s completion queue from the
// calling thread, until the client closes it. False if the stream broke.
bool serve_one_stream(::grpc::AsyncGenericService& service,
                      ::grpc::ServerCompletionQueue& queue);

// A client's bidirectional stream. ping() writes a message and returns
// when its echo has arrived (and the write has completed: only then may
// the next write start).
class Pinger {
 public:
  virtual ~Pinger() = default;
  virtual bool ping(const ::grpc::ByteBuffer& message) = 0;
  // Closes the stream and waits for its end.
  virtual void close() = 0;
};

// Through the callback API: the library's threads run the reactions and
// the caller waits for them.
std::unique_ptr<Pinger> callback_pinger(::grpc::GenericStub& stub);
// Through a completion queue the caller's thread drives.
std::unique_ptr<Pinger> queue_pinger(::grpc::GenericStub& stub);

}  // namespace tether::bench::grpc_echo

#endif  // TETHER_TOOLS_INTERNAL_GRPC_ECHO_H_
