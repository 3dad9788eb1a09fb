// The assist of a backend whose answers arrive on a file descriptor: a
// thread that sent a request, and then waits for a future (its answer, as a
// rule), waits on that descriptor itself and handles what arrives where it
// is, instead of sleeping until the backend's own thread has handled the
// answer and wakes it (tether::internal::WaitAssist, core/future.h). The
// answer then costs one wake-up, of the thread that wants it, instead of
// two. The tensorpipe backend's tcp transport lends a connection's socket
// (tcp_transport_connection.h); the libfabric backend its completion
// queue's descriptor (internal/agent_state.h).
//
// The backend arms the assist on the thread that has just sent
// (arm_fd_assist); the next wait for a pending future on that thread takes
// it. While it waits, the thread polls the source's descriptor and its own
// eventfd (made at its first wait, so a thread that sends but never waits
// holds none); the completer of its future wakes it through the eventfd
// when that is another thread.
//
// Thread safety: arm_fd_assist() arms the calling thread's assist only; an
// AssistSource's methods are called from the waiting thread, which is never
// the backend's own.
#ifndef TETHER_BACKENDS_COMMON_FD_ASSIST_H_
#define TETHER_BACKENDS_COMMON_FD_ASSIST_H_

#include <memory>

namespace tether::backends::common {

// What a backend lends a waiting thread.
class AssistSource {
 public:
  virtual ~AssistSource() = default;
  // The backend's own thread stops watching the descriptor; returns it, or
  // -1 if this source cannot be assisted now (then nothing is to end).
  virtual int begin_assist() = 0;
  // The descriptor is readable, hung up, or the poll timed out: handles
  // what arrived. False once the source cannot be assisted any longer.
  virtual bool assist_step() = 0;
  // The backend's own thread watches the descriptor again.
  virtual void end_assist() = 0;
};

// Arms the calling thread's assist with `source` (held weakly) for its
// next wait.
void arm_fd_assist(std::weak_ptr<AssistSource> source);

// The descriptors the assists of this process hold: one eventfd per thread
// that has waited with an assist, from that first wait until the thread
// exits. Which threads those are depends on timing (a send runs inline on
// the caller's thread or on the backend's), so tests that count a
// process's descriptors count these apart.
int assist_descriptors();

}  // namespace tether::backends::common

#endif  // TETHER_BACKENDS_COMMON_FD_ASSIST_H_
