// A connection of tether's TCP transport (tcp_transport.h): the handshake
// that guards it (tcp_transport_handshake.cc) and the frames it carries
// once established (tcp_transport_connection.cc). Internal to that
// transport.
//
// Threads: every method runs in the context's loop (on whichever thread
// is in it; tcp_transport_context.h), but the three of the assist, which
// any thread outside it calls.
//
// The assist (backends/common/fd_assist.h): a thread other than the
// poller that writes a frame arms it, and when that thread then waits for
// a future (the answer to its request, as a rule), it stops the poller
// from reading this connection, waits in poll() on the socket and on its
// own eventfd, and reads and handles what arrives itself, until its future
// completes. The answer then costs one wake-up, of the thread that wants
// it, instead of two (the poller's, then the waiter's).
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONNECTION_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONNECTION_H_

#include <absl/status/status.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/string_view.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/transport/connection_impl_boilerplate.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/common/fd_assist.h"
#include "backends/tensorpipe/internal/tcp_handshake.h"
#include "backends/tensorpipe/internal/tcp_transport_context.h"
#include "core/auth/handshake.h"

namespace tether::backends::tensorpipe::internal::tcp {

class ConnectionImpl;
// For OpenedConnection (tcp_transport.h): a connection being opened here.
void note_opened(ConnectionImpl* connection);

// Reads go through a buffer in chunks of this size (one recv() takes a
// whole inline message, up to 48 KiB of storages).
inline constexpr size_t kChunk = 64 << 10;
// A payload's remainder at least this large is read straight into its
// destination: a recv() more costs less than copying it out of the buffer.
inline constexpr size_t kDirect = 16 << 10;
// Bytes read ahead while TensorPipe has no read pending.
inline constexpr size_t kReadAhead = 256 << 10;
static_assert(kMaxExpressBytes + sizeof(uint64_t) < kReadAhead,
              "an express frame begun in the buffer is always read on");
// Frames of one write call gathered into one sendmsg().
inline constexpr size_t kMaxIov = 64;

class ConnectionImpl final
    : public tpt::ConnectionImplBoilerplate<ContextImpl, ListenerImpl,
                                            ConnectionImpl>,
      public Handler,
      public common::AssistSource {
 public:
  // Accepted by `listener` (its key for this connection: `key`).
  ConnectionImpl(ConstructorToken token, std::shared_ptr<ContextImpl> context,
                 std::string id, int fd, std::string peer,
                 std::weak_ptr<ListenerImpl> listener, uint64_t key)
      : ConnectionImplBoilerplate(token, std::move(context), std::move(id)),
        server_(true),
        fd_(fd),
        peer_(std::move(peer)),
        listener_(std::move(listener)),
        key_(key) {}

  // Connecting to `addr`.
  ConnectionImpl(ConstructorToken token, std::shared_ptr<ContextImpl> context,
                 std::string id, std::string addr)
      : ConnectionImplBoilerplate(token, std::move(context), std::move(id)),
        server_(false),
        peer_(std::move(addr)) {
    note_opened(this);
  }

  ~ConnectionImpl() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void on_events(uint32_t events) override;

  // The assist; any thread not in the loop. begin_assist(): the poller
  // stops reading this connection; returns its socket, or -1 if it cannot
  // be assisted (not established, failed). assist_step(): the socket is
  // readable (or hung up): reads and handles what came; false once the
  // connection cannot be assisted any longer. end_assist(): the poller
  // reads it again.
  // Sends what a GatheredWrites gathered (tcp_transport.h) once the loop
  // is idle; any thread.
  void flush_gathered();
  // Loop only: the queued writes are sent once the loop has no task left
  // (ContextImpl::flush_when_idle), with those queued meanwhile.
  void flush_when_idle();
  // Loop only: sends the queued writes (as much as the socket takes).
  void flush();

  int begin_assist() override;
  bool assist_step() override;
  void end_assist() override;

  // Runs `fn` in the loop (at once if this thread is in it).
  template <typename Fn>
  void in_loop(Fn fn) {
    if (context_->inLoop()) {
      fn();
      return;
    }
    context_->deferToLoop(std::move(fn));
  }

  // Express frames (tcp_transport.h). Loop only: queues `frame`, sent as
  // the writes are; dropped once failed.
  void express_from_loop(std::string frame);
  // Loop only: fails the connection, logging `why`.
  void fail_from_loop(const std::string& why);
  // Set once established; loop only until then.
  const std::string& peer_name() const { return peer_name_; }

 protected:
  void initImplFromLoop() override;
  void readImplFromLoop(read_callback_fn fn) override;
  void readImplFromLoop(tp::AbstractNopHolder& object,
                        read_nop_callback_fn fn) override;
  void readImplFromLoop(void* ptr, size_t length, read_callback_fn fn) override;
  void writeImplFromLoop(const void* ptr, size_t length,
                         write_callback_fn fn) override;
  void handleErrorImpl() override;

 private:
  enum class State { kConnecting, kHandshake, kRefusing, kEstablished };
  enum class Step { kAwaitHello, kAwaitProof, kAwaitVerdict };
  enum class Fill { kData, kAgain, kClosed };

  struct ReadOp {
    read_callback_fn fn;
    char* ptr = nullptr;
    size_t length = 0;
    bool given = false;  // the caller gave ptr and length
    std::unique_ptr<char[]> owned;
    bool have_length = false;
    size_t done = 0;
  };
  struct WriteOp {
    uint64_t header = 0;  // the length, with kExpressBit for an express frame
    const char* ptr = nullptr;
    size_t done = 0;  // of the header's 8 bytes and then the payload
    write_callback_fn fn;  // null for an express frame
    std::string owned;     // an express frame's bytes
    size_t length() const { return header & ~kExpressBit; }
  };

  // Handshake.
  void start_client_handshake();
  void on_handshake_input();
  void on_frame(const HandshakeFrame& frame);
  void on_server_frame(const HandshakeFrame& frame);
  void on_client_frame(const HandshakeFrame& frame);
  // Why `name` may not take part, or "" if it may.
  std::string check_member(const std::string& name) const;
  // "worker '<self>': <what the handshake machine said>".
  std::string refusal_text(const absl::Status& status) const;
  // This side's Hello without the challenge: kind, name, has_secret.
  HandshakeFrame own_hello() const;
  void send_frame(const HandshakeFrame& frame);
  // Server: tells the peer `reason`, logs it, and waits for the peer to
  // close (bounded by the handshake deadline).
  void refuse(const std::string& reason);
  // Logs (rate limited) and fails the connection with `error`.
  void fail(tp::Error error, const std::string& why, bool log);
  void established();
  void on_handshake_timeout();
  // handshake_timeout for a connection accepted here, connect_timeout for
  // one opened here.
  absl::Duration handshake_bound() const {
    return server_ ? context_->options().handshake_timeout
                   : context_->options().connect_timeout;
  }
  void notify_listener(bool ok);

  // Data. `readable`: the socket was reported readable (the poller's
  // wake-up, the assist's poll), so the call reads ahead even with no read
  // pending (the socket is level-triggered: it must not spin). A call
  // because TensorPipe posted a read reads only for pending reads.
  void process_reads(bool readable);
  // At a frame boundary, with the next frame's length word buffered and
  // its top bit set: hands the frame to the sink once it is all buffered
  // (reading what is missing, as far as the socket has it). kTaken: done,
  // go on; kWanting: wait for more bytes; kFailed: the connection failed.
  enum class Express { kTaken, kWanting, kFailed };
  Express take_express();
  // Whether the buffered frame's length word (all there) marks it express.
  bool next_is_express() const {
    uint64_t word = 0;
    std::memcpy(&word, buffered().data(), sizeof(word));
    return (word & kExpressBit) != 0;
  }
  // Queues `op` and has it sent (writeImplFromLoop's tail).
  void queue_write(WriteOp op);
  void process_writes();
  // Reads at most `most` bytes into the buffer. kClosed: the peer closed
  // or the socket failed; why is in fill_error_ (not yet set on the
  // connection).
  Fill fill(size_t most);
  // fill(), failing the connection on kClosed; true if bytes came.
  bool fill_or_fail(size_t most);
  void update_interest();
  // Established, not failed, and a read is pending or the read-ahead
  // buffer has room.
  bool wants_input() const;

  absl::string_view buffered() const {
    return absl::string_view(in_.data() + in_begin_, in_end_ - in_begin_);
  }
  void consume(size_t n) {
    in_begin_ += n;
    if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  }
  std::string describe_peer() const {
    return peer_name_.empty()
               ? peer_
               : absl::StrCat("'", peer_name_, "' (", peer_, ")");
  }

  const bool server_;
  int fd_ = -1;
  const std::string peer_;  // the peer's address
  const std::weak_ptr<ListenerImpl> listener_;
  const uint64_t key_ = 0;

  State state_ = State::kConnecting;
  Step step_ = Step::kAwaitHello;
  uint32_t interest_ = 0;
  // Threads assisting (begin_assist without end_assist): while any, the
  // poller does not watch for input.
  int assistants_ = 0;
  bool listener_notified_ = false;
  std::string peer_name_;
  // The challenge-response (with a secret): client initiator(), server
  // responder_three_step(); the server's Hello and Proof share a frame.
  std::optional<auth::Handshake> handshake_;
  std::string refusal_;
  tp::Error fill_error_;
  // The last recv() took less than it asked for: the socket had nothing
  // more then. No recv() until the poller reports it readable again (its
  // sockets are level-triggered): saves a recv() that would only say
  // EAGAIN after every message.
  bool drained_ = false;
  // A flush of the queued writes waits for the loop to be idle.
  bool flush_queued_ = false;
  // The last sendmsg() left bytes unsent: the poller watches for EPOLLOUT
  // (queued writes wait for a flush, not for it).
  bool socket_full_ = false;

  std::vector<char> in_;
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  std::string handshake_out_;
  size_t handshake_sent_ = 0;

  std::deque<ReadOp> reads_;
  std::deque<WriteOp> writes_;
};

}  // namespace tether::backends::tensorpipe::internal::tcp

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_CONNECTION_H_
