// KeptSignals: while one lives, code that installs signal handlers behind
// the program's back has them undone when it ends (internal to the
// libfabric backend, which runs libfabric's loading and its providers'
// set-up under one).
//
// Why: libraries libfabric loads install handlers behind the program's
// back. libfabric's shm provider installs its own for SIGINT, SIGBUS,
// SIGSEGV and SIGTERM at its first endpoint (to unlink its shared memory,
// taking a mutex inside the handler), and has no switch to stop it.
// Debian's libfabric.so.1 needs libpsm2.so.2, whose constructor installs
// handlers for SIGINT, SIGILL, SIGABRT, SIGBUS, SIGSEGV and SIGTERM when
// HFI_BACKTRACE is set, and libinfinipath.so.4, whose constructor installs
// the same ones unless IPATH_NO_BACKTRACE is set (fabric_library.h sets
// it for the load); theirs print "terminated with signal N" and call
// exit() inside the handler, so a crash becomes exit status 1 and SIGTERM
// can hang the process in its exit handlers. A tether process keeps the
// dispositions its program chose (docs/reliability.md, "Signals").
//
// How: the constructor saves the disposition of every signal sigaction
// reports on (1 to 64; glibc refuses its own 32 and 33); the destructor
// puts back each one that changed meanwhile, on the same thread, right
// after the code ran, and logs which (glog, at VLOG(1)). Deterministic:
// no handler outlives the scope, whatever the library's code did; one that
// a signal finds during the scope runs.
//
// Thread safety: scopes are serialised by a process-wide mutex, so two
// threads opening libfabric at once cannot save each other's handlers; a
// scope nested on the same thread is part of the outer one. A disposition
// another thread changes during a scope is put back as well: keep scopes to
// the library calls that need one (tether changes no disposition
// meanwhile: its one change, SIGPIPE to ignored, happens at the start of
// Worker::create, before any backend runs).
#ifndef TETHER_BACKENDS_LIBFABRIC_INTERNAL_KEPT_SIGNALS_H_
#define TETHER_BACKENDS_LIBFABRIC_INTERNAL_KEPT_SIGNALS_H_

#include <signal.h>

#include <vector>

namespace tether::backends::libfabric::internal {

class KeptSignals {
 public:
  // `why` names the code the scope covers, for the log ("dlopen
  // libfabric.so.1"); it must outlive the scope.
  explicit KeptSignals(const char* why);
  ~KeptSignals();
  KeptSignals(const KeptSignals&) = delete;
  KeptSignals& operator=(const KeptSignals&) = delete;

  // How many dispositions the outermost scope that ended last on this
  // thread put back (for tests).
  static int last_restored_count();

 private:
  struct Saved {
    int signal;
    struct sigaction action;
  };
  const char* const why_;
  const bool outermost_;
  std::vector<Saved> saved_;
};

}  // namespace tether::backends::libfabric::internal

#endif  // TETHER_BACKENDS_LIBFABRIC_INTERNAL_KEPT_SIGNALS_H_
