// What a process does with each signal, for tests that check tether leaves
// signals alone: a snapshot of every signal's disposition (sigaction), the
// differences between two snapshots, and the kernel's summary of caught
// and ignored signals (/proc/self/status).
//
// A disposition is the default, ignored, or a handler: which function
// (named by the library it sits in, through dladdr) and its flags. Two
// snapshots compare handlers by address, so a library that replaces a
// handler already installed (libinfinipath's constructor took Python's
// SIGINT handler) shows as a difference, which SigCgt alone would not.
//
// glibc keeps signals 32 and 33 for itself (thread cancellation and
// set*id across threads; it installs the second at the first
// pthread_create) and sigaction refuses them: snapshots leave them out,
// and so does caught_signals().
//
// Thread safety: each call reads the process's state afresh; compare
// snapshots taken while no other thread of the test changes dispositions.
#ifndef TETHER_TESTING_SIGNAL_DISPOSITIONS_H_
#define TETHER_TESTING_SIGNAL_DISPOSITIONS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tether::testing {

struct SignalDisposition {
  int signal = 0;
  // SIG_DFL, SIG_IGN or the handler, as an address.
  uintptr_t handler = 0;
  // sa_flags without SA_RESTORER, which glibc adds to every handler it
  // installs.
  uint64_t flags = 0;

  bool is_default() const;
  bool is_ignored() const;
  bool is_caught() const { return !is_default() && !is_ignored(); }
  // "default", "ignored" or "handler 0x... in libfoo.so.1 (flags 0x...)".
  std::string describe() const;
  bool operator==(const SignalDisposition& other) const;
  bool operator!=(const SignalDisposition& other) const {
    return !(*this == other);
  }
};

// Every signal from 1 to 64 that sigaction reports on, in order.
std::vector<SignalDisposition> signal_dispositions();

// One line per signal whose disposition differs between the snapshots
// ("SIGTERM (15): default -> handler 0x... in libinfinipath.so.4"), or
// empty when they are equal. `allow_sigpipe_ignored` leaves out SIGPIPE
// going from the default to ignored: Worker::create does that on purpose
// (docs/reliability.md, "Signals").
std::string signal_changes(const std::vector<SignalDisposition>& before,
                           const std::vector<SignalDisposition>& after,
                           bool allow_sigpipe_ignored = false);

// The signals that have a handler, by number.
std::vector<int> caught_signals(const std::vector<SignalDisposition>& snapshot);

// "SigCgt {2,4,6} SigIgn {13}" from /proc/self/status, glibc's own 32 and
// 33 left out: what the kernel says, for the test's log.
std::string proc_signal_sets();

// Whether a library whose file name starts with `name` is mapped into this
// process (/proc/self/maps), e.g. "libfabric.so.1" (not "libfabric.so":
// in a test built by Bazel, the library of the backend's own :fabric
// target is a file of that name).
bool library_mapped(const std::string& name);

}  // namespace tether::testing

#endif  // TETHER_TESTING_SIGNAL_DISPOSITIONS_H_
