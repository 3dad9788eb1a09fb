// TensorPipe's pipe alone between two processes: the floor the tensorpipe
// backend stands on for a small call, with no tether agent, codec or
// operator on the path (tools/rpc_latency.cc measures it beside tether's
// call and raw TCP in the same run).
#include "tools/internal/tp_pipe.h"

#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/mutex.h>
#include <tensorpipe/tensorpipe.h>

#include <algorithm>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/tensorpipe/internal/framing.h"
#include "backends/tensorpipe/internal/tcp_transport.h"
#include "tools/internal/launcher_env.h"
#include "tools/internal/samples.h"

namespace tether::bench {
namespace {

namespace tp = ::tensorpipe;

// One side of the ping-pong, driven from TensorPipe's callbacks. Rank 0
// writes first and times; rank 1 answers. `done` is set after `rounds`
// round trips, or on the first error.
class Side : public std::enable_shared_from_this<Side> {
 public:
  Side(std::shared_ptr<tp::Pipe> pipe, bool timing, int rounds, int warmup,
       size_t data_bytes)
      : pipe_(std::move(pipe)),
        timing_(timing),
        rounds_(rounds),
        warmup_(warmup),
        inline_(data_bytes <= backends::tensorpipe::internal::kInlineLimit),
        out_(kFrameBytes + (inline_ ? data_bytes : 0), 'x'),
        out_payload_(inline_ ? 0 : data_bytes, 'y'),
        in_payload_(out_payload_.size()) {
    samples_.reserve(static_cast<size_t>(rounds));
  }

  void start() {
    if (timing_) {
      write();
    }
    read();
  }

  // Blocks until every round trip was made or one failed.
  absl::Status wait(std::vector<double>* samples) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    if (samples != nullptr) *samples = std::move(samples_);
    return status_;
  }

 private:
  void write() {
    tp::Message message;
    message.metadata = out_;
    if (!inline_) {
      // As the backend sends a storage: pointing at it, no copy.
      message.payloads.push_back(tp::Message::Payload{
          .data = const_cast<char*>(out_payload_.data()),
          .length = out_payload_.size()});
    }
    if (timing_) start_ = Clock::now();
    pipe_->write(std::move(message),
                 [self = shared_from_this()](const tp::Error& error) {
                   if (error) self->fail(error.what());
                 });
  }

  void read() {
    pipe_->readDescriptor([self = shared_from_this()](
                              const tp::Error& error, tp::Descriptor descriptor) {
      if (error) return self->fail(error.what());
      const size_t payloads = self->inline_ ? 0 : 1;
      if (descriptor.metadata.size() != self->out_.size() ||
          descriptor.payloads.size() != payloads ||
          (payloads == 1 &&
           descriptor.payloads[0].length != self->in_payload_.size()) ||
          !descriptor.tensors.empty()) {
        return self->fail("unexpected message");
      }
      tp::Allocation allocation;
      if (payloads == 1) {
        allocation.payloads.push_back(
            tp::Allocation::Payload{.data = self->in_payload_.data()});
      }
      self->pipe_->read(std::move(allocation), [self](const tp::Error& error) {
        if (error) return self->fail(error.what());
        self->on_message();
      });
    });
  }

  void on_message() {
    ++seen_;
    if (timing_ && seen_ > warmup_) {
      samples_.push_back(micros_since(start_));
    }
    // The answerer answers the last one too; the timer sends no more.
    const bool last = seen_ == warmup_ + rounds_;
    if (!timing_ || !last) write();
    if (last) {
      absl::MutexLock lock(&mu_);
      done_ = true;
      return;
    }
    read();
  }

  void fail(const std::string& why) {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    status_ = absl::UnavailableError(why);
    done_ = true;
  }

  std::shared_ptr<tp::Pipe> pipe_;
  const bool timing_;
  const int rounds_;
  const int warmup_;
  // The message's layout: all in the metadata, or the data as a payload.
  const bool inline_;
  const std::string out_;
  const std::string out_payload_;
  std::vector<char> in_payload_;
  int seen_ = 0;
  Clock::time_point start_;
  std::vector<double> samples_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

std::shared_ptr<tp::transport::Context> make_transport(const std::string& name,
                                                      int rank) {
  if (name == "uv") return tp::transport::uv::create();
  tether::backends::tensorpipe::internal::TcpTransportOptions options;
  options.self = absl::StrCat("w", rank);
  options.members = {"w0", "w1"};
  options.log_prefix = "tensorpipe pipe ping-pong";
  return tether::backends::tensorpipe::internal::create_tcp_transport(std::move(options));
}

}  // namespace

absl::StatusOr<std::vector<double>> tensorpipe_pipe_ping_pong(
    const std::string& name, int rank, c10d::Store& store, int calls,
    size_t data_bytes) {
  auto context = std::make_shared<tp::Context>();
  context->registerTransport(0, name, make_transport(name, rank));
  context->registerChannel(0, "basic", tp::channel::basic::create());
  const int warmup = std::max(100, calls / 10);
  const std::string key = absl::StrCat("tensorpipe_pipe_ping_pong/", name);
  std::shared_ptr<Side> side;
  std::shared_ptr<tp::Listener> listener;
  if (rank == 1) {
    absl::StatusOr<std::string> host = listen_address();
    if (!host.ok()) return host.status();
    listener = context->listen({absl::StrCat(name, "://", *host)});
    std::promise<std::shared_ptr<tp::Pipe>> accepted;
    std::future<std::shared_ptr<tp::Pipe>> pipe = accepted.get_future();
    listener->accept(
        [&accepted](const tp::Error& error, std::shared_ptr<tp::Pipe> pipe) {
          accepted.set_value(error ? nullptr : std::move(pipe));
        });
    const std::string url = listener->url(name);
    store.set(key, std::vector<uint8_t>(url.begin(), url.end()));
    std::shared_ptr<tp::Pipe> answerer = pipe.get();
    if (answerer == nullptr) {
      return absl::UnavailableError("the listener accepted no pipe");
    }
    side = std::make_shared<Side>(std::move(answerer), false, calls, warmup,
                                  data_bytes);
  } else {
    const std::vector<uint8_t> raw = store.get(key);
    const std::string url(raw.begin(), raw.end());
    side = std::make_shared<Side>(
        context->connect(url, tp::PipeOptions().remoteName("w1")), true, calls,
        warmup, data_bytes);
  }
  side->start();
  std::vector<double> samples;
  absl::Status s = side->wait(rank == 0 ? &samples : nullptr);
  if (!s.ok()) return s;
  // Both sides are done before either closes its pipe.
  store.set(absl::StrCat(key, "/done", rank), {1});
  store.wait({absl::StrCat(key, "/done0"), absl::StrCat(key, "/done1")});
  context->close();
  context->join();
  return samples;
}

}  // namespace tether::bench
