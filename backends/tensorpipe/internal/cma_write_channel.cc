// The `cma_write` channel: the sender writes into the receiver's memory
// (cma_write_channel.h says why and how).
#include "backends/tensorpipe/internal/cma_write_channel.h"

#include <absl/base/thread_annotations.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <sys/uio.h>
#include <tensorpipe/channel/channel_impl_boilerplate.h>
#include <tensorpipe/channel/cma/factory.h>
#include <tensorpipe/channel/context_boilerplate.h>
#include <tensorpipe/channel/context_impl_boilerplate.h>
#include <tensorpipe/common/cpu_buffer.h>
#include <tensorpipe/common/deferred_executor.h>
#include <tensorpipe/common/error.h>
#include <tensorpipe/transport/connection.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tether::backends::tensorpipe::internal {
namespace {

namespace tp = ::tensorpipe;

// A tensorpipe::Error of type T, saying where it arose.
#define CMA_WRITE_ERROR(T, ...) \
  ::tensorpipe::Error(std::make_shared<T>(__VA_ARGS__), __FILE__, __LINE__)

// The error of a channel whose peer broke the protocol.
class CmaWriteError final : public tp::BaseError {
 public:
  explicit CmaWriteError(std::string what) : what_(std::move(what)) {}
  std::string what() const override { return what_; }

 private:
  std::string what_;
};

tp::Error channel_error(const std::string& what) {
  return CMA_WRITE_ERROR(CmaWriteError, absl::StrCat("cma_write channel: ", what));
}

enum class NoteKind : uint32_t {
  kGrant = 0x544e5247,  // "GRNT"
  kDone = 0x454e4f44,   // "DONE"
};

// Both processes are on one machine: the layout is the same on both sides.
struct Note {
  NoteKind kind;
  // A grant: the receiver's pid. Done: 0, or the errno of the write.
  int32_t value;
  uint64_t sequence;
  uint64_t address;  // a grant's only
  uint64_t length;   // a grant's only
};
static_assert(sizeof(Note) == kCmaWriteNoteBytes);

// Grants the sender holds ahead of its sends, at most (a receiver posts one
// per tensor it was told of; far more is a broken peer).
constexpr size_t kMaxEarlyGrants = 1 << 16;

class ChannelImpl;

class ContextImpl final
    : public tp::channel::ContextImplBoilerplate<ContextImpl, ChannelImpl> {
 public:
  static std::shared_ptr<ContextImpl> create() {
    // TensorPipe's `cma` decides whether cross-memory copies work between
    // processes here; its device descriptor becomes this channel's.
    std::shared_ptr<tp::channel::Context> cma = tp::channel::cma::create();
    const bool viable = cma->isViable();
    std::unordered_map<tp::Device, std::string> descriptors;
    if (viable) descriptors = cma->deviceDescriptors();
    cma->close();
    cma->join();
    if (!viable) return nullptr;
    return std::make_shared<ContextImpl>(std::move(descriptors));
  }

  explicit ContextImpl(std::unordered_map<tp::Device, std::string> descriptors)
      : tp::channel::ContextImplBoilerplate<ContextImpl, ChannelImpl>(
            std::move(descriptors)),
        thread_([this] { copy_loop(); }) {}

  std::shared_ptr<tp::channel::Channel> createChannel(
      std::vector<std::shared_ptr<tp::transport::Connection>> connections,
      tp::channel::Endpoint /*endpoint*/) {
    TP_DCHECK_EQ(connections.size(), 1);
    return createChannelInternal(std::move(connections[0]));
  }

  bool inLoop() const override { return loop_.inLoop(); }
  void deferToLoop(std::function<void()> fn) override {
    loop_.deferToLoop(std::move(fn));
  }

  // Writes `length` bytes from `local` into process `pid` at `address` on
  // the copy thread, in the order asked; `done` gets 0 or the errno, on
  // that thread.
  void request_write(pid_t pid, uint64_t address, const void* local,
                     size_t length, std::function<void(int)> done) {
    absl::MutexLock lock(&mu_);
    writes_.push_back(Write{pid, address, local, length, std::move(done)});
  }

 protected:
  void handleErrorImpl() override {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }

  // Writes asked before the close are made: their sends wait for them.
  void joinImpl() override {
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Write {
    pid_t pid;
    uint64_t address;
    const void* local;
    size_t length;
    std::function<void(int)> done;
  };

  bool has_work() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !writes_.empty();
  }

  void copy_loop() {
    for (;;) {
      Write write;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &ContextImpl::has_work));
        if (writes_.empty()) return;
        write = std::move(writes_.front());
        writes_.pop_front();
      }
      write.done(write_all(write));
    }
  }

  static int write_all(const Write& write) {
    size_t done = 0;
    while (done < write.length) {
      iovec local{const_cast<char*>(static_cast<const char*>(write.local)) + done,
                  write.length - done};
      iovec remote{reinterpret_cast<void*>(write.address + done),
                   write.length - done};
      const ssize_t n = ::process_vm_writev(write.pid, &local, 1, &remote, 1, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      if (n == 0) return EFAULT;
      done += static_cast<size_t>(n);
    }
    return 0;
  }

  tp::OnDemandDeferredExecutor loop_;
  absl::Mutex mu_;
  std::deque<Write> writes_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts once the rest is made
};

class ChannelImpl final
    : public tp::channel::ChannelImplBoilerplate<ContextImpl, ChannelImpl> {
 public:
  ChannelImpl(ConstructorToken token, std::shared_ptr<ContextImpl> context,
              std::string id, std::shared_ptr<tp::transport::Connection> connection)
      : tp::channel::ChannelImplBoilerplate<ContextImpl, ChannelImpl>(
            token, std::move(context), std::move(id)),
        connection_(std::move(connection)) {}

 protected:
  void initImplFromLoop() override {
    context_->enroll(*this);
    read_note();
  }

  void sendImplFromLoop(uint64_t sequence, tp::Buffer buffer, size_t length,
                        tp::channel::TSendCallback callback) override {
    if (length == 0) {
      callback(tp::Error::kSuccess);
      return;
    }
    sends_.push_back(Send{sequence, buffer.unwrap<tp::CpuBuffer>().ptr, length,
                          std::move(callback)});
    start_writes();
  }

  void recvImplFromLoop(uint64_t sequence, tp::Buffer buffer, size_t length,
                        tp::channel::TRecvCallback callback) override {
    if (length == 0) {
      callback(tp::Error::kSuccess);
      return;
    }
    recvs_.push_back(Recv{sequence, std::move(callback)});
    write_note(Note{NoteKind::kGrant, static_cast<int32_t>(::getpid()),
                    sequence,
                    reinterpret_cast<uint64_t>(
                        buffer.unwrap<tp::CpuBuffer>().ptr),
                    length});
  }

  void handleErrorImpl() override {
    // A send not yet being written fails now; one being written when its
    // write returns (its memory is read until then).
    while (sends_.size() > writing_) {
      Send send = std::move(sends_[writing_]);
      sends_.erase(sends_.begin() + static_cast<std::ptrdiff_t>(writing_));
      send.callback(error_);
    }
    // Receives fail now; the buffers of those granted are quarantined by
    // whoever gave them (the header says so).
    std::deque<Recv> recvs = std::move(recvs_);
    recvs_.clear();
    for (Recv& recv : recvs) recv.callback(error_);
    grants_.clear();
    connection_->close();
    if (writing_ == 0) context_->unenroll(*this);
  }

 private:
  struct Send {
    uint64_t sequence;
    const void* ptr;
    size_t length;
    tp::channel::TSendCallback callback;
  };
  struct Recv {
    uint64_t sequence;
    tp::channel::TRecvCallback callback;
  };

  void read_note() {
    connection_->read(
        in_.data(), in_.size(),
        callbackWrapper_([](ChannelImpl& impl, const void* /*ptr*/,
                            size_t /*length*/) { impl.on_note(); }));
  }

  void write_note(const Note& note) {
    auto bytes = std::make_shared<std::array<char, kCmaWriteNoteBytes>>();
    std::memcpy(bytes->data(), &note, sizeof note);
    connection_->write(bytes->data(), bytes->size(),
                       callbackWrapper_([bytes](ChannelImpl& /*impl*/) {}));
  }

  void on_note() {
    if (error_) return;
    Note note;
    std::memcpy(&note, in_.data(), sizeof note);
    switch (note.kind) {
      case NoteKind::kGrant:
        on_grant(note);
        break;
      case NoteKind::kDone:
        on_done(note);
        break;
      default:
        setError(channel_error(absl::StrCat(
            "a note of unknown kind ", static_cast<uint32_t>(note.kind))));
        return;
    }
    if (!error_) read_note();
  }

  void on_grant(const Note& grant) {
    if (grants_.size() >= kMaxEarlyGrants) {
      setError(channel_error(absl::StrCat("more than ", kMaxEarlyGrants,
                                          " grants ahead of the sends")));
      return;
    }
    grants_.push_back(grant);
    start_writes();
  }

  // Pairs grants with the sends they are for, in order, and asks for their
  // writes.
  void start_writes() {
    while (!error_ && !grants_.empty() && writing_ < sends_.size()) {
      const Note grant = grants_.front();
      grants_.pop_front();
      const Send& send = sends_[writing_];
      if (grant.sequence != send.sequence || grant.length != send.length) {
        setError(channel_error(absl::StrCat(
            "a grant for tensor ", grant.sequence, " of ", grant.length,
            " bytes where tensor ", send.sequence, " of ", send.length,
            " bytes was next")));
        return;
      }
      ++writing_;
      context_->request_write(
          static_cast<pid_t>(grant.value), grant.address, send.ptr,
          send.length,
          [self = shared_from_this(), sequence = send.sequence](int error) {
            self->context_->deferToLoop([self, sequence, error] {
              self->on_written(sequence, error);
            });
          });
    }
  }

  // Writes return in the order they were asked: the first send's.
  void on_written(uint64_t sequence, int error) {
    TP_DCHECK(!sends_.empty() && sends_.front().sequence == sequence);
    Send send = std::move(sends_.front());
    sends_.pop_front();
    --writing_;
    if (error_) {
      send.callback(error_);
      if (writing_ == 0) context_->unenroll(*this);
      return;
    }
    // The receiver learns either way; a failed send fails the sender's
    // pipe (TensorPipe's), after the note is on its way.
    write_note(Note{NoteKind::kDone, error, sequence, 0, 0});
    send.callback(error == 0 ? tp::Error::kSuccess
                             : CMA_WRITE_ERROR(tp::SystemError,
                                               "process_vm_writev", error));
  }

  void on_done(const Note& done) {
    if (recvs_.empty() || recvs_.front().sequence != done.sequence) {
      setError(channel_error(absl::StrCat(
          "a done note for tensor ", done.sequence, " where ",
          recvs_.empty() ? std::string("none was granted")
                         : absl::StrCat("tensor ", recvs_.front().sequence,
                                        " was next"))));
      return;
    }
    Recv recv = std::move(recvs_.front());
    recvs_.pop_front();
    if (done.value != 0) {
      const tp::Error failed = channel_error(
          absl::StrCat("the sender could not write tensor ", done.sequence,
                       ": ", std::strerror(done.value)));
      recv.callback(failed);
      setError(failed);
      return;
    }
    recv.callback(tp::Error::kSuccess);
  }

  const std::shared_ptr<tp::transport::Connection> connection_;
  std::array<char, kCmaWriteNoteBytes> in_{};
  std::deque<Send> sends_;  // in order; the first writing_ are being written
  size_t writing_ = 0;
  std::deque<Note> grants_;  // grants that came ahead of their sends
  std::deque<Recv> recvs_;   // granted, in order
};

}  // namespace

std::shared_ptr<tp::channel::Context> create_cma_write_channel() {
  return std::make_shared<tp::channel::ContextBoilerplate<ContextImpl, ChannelImpl>>();
}

}  // namespace tether::backends::tensorpipe::internal
