// The listener of tether's TCP transport (tcp_transport.h): accepts
// connections, holds each until its handshake ends (at most kMaxHandshakes
// at once; the rest wait in the kernel's backlog), and hands TensorPipe only those that passed. Internal to that
// transport.
//
// Threads: every method runs in the context's loop (on whichever thread
// is in it; tcp_transport_context.h).
#ifndef TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_LISTENER_H_
#define TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_LISTENER_H_

#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/listener_impl_boilerplate.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>

#include "backends/tensorpipe/internal/tcp_transport_context.h"

namespace tether::backends::tensorpipe::internal::tcp {

class ListenerImpl final
    : public tpt::ListenerImplBoilerplate<ContextImpl, ListenerImpl,
                                          ConnectionImpl>,
      public Handler {
 public:
  ListenerImpl(ConstructorToken token, std::shared_ptr<ContextImpl> context,
               std::string id, std::string addr)
      : ListenerImplBoilerplate(token, std::move(context), std::move(id)),
        requested_(std::move(addr)) {}

  ~ListenerImpl() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void on_events(uint32_t events) override;

  // Loop thread: the handshake of connection `key` ended.
  void handshake_done(uint64_t key, bool ok);

 protected:
  void initImplFromLoop() override;
  void acceptImplFromLoop(accept_callback_fn fn) override;
  std::string addrImplFromLoop() const override { return address_; }
  void handleErrorImpl() override;

 private:
  void deliver();

  const std::string requested_;
  std::string address_;
  int fd_ = -1;
  bool paused_ = false;
  // kMaxHandshakes are handshaking: not accepting until one ends.
  bool full_ = false;
  uint64_t next_key_ = 1;
  std::deque<accept_callback_fn> fns_;
  std::deque<std::shared_ptr<tpt::Connection>> ready_;
  std::unordered_map<uint64_t, std::shared_ptr<tpt::Connection>> handshaking_;
};

}  // namespace tether::backends::tensorpipe::internal::tcp

#endif  // TETHER_BACKENDS_TENSORPIPE_INTERNAL_TCP_TRANSPORT_LISTENER_H_
