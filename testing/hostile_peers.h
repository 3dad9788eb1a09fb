// The hostile-peer suite: a stranger's bytes must never crash,
// hang or leak a worker. Run once per multi-process backend, as the
// conformance suite is.
//
// Each test runs a group of 3 worker processes (testing/multiprocess.h) of
// the backend under test that meet through env:// as "agent<rank>". Rank 1
// is the worker under attack. Once every pair has talked (so the group's
// own connections are up), it takes its baseline: open file descriptors
// (/proc/self/fd) and malloc's bytes in use, and publishes the TCP
// addresses it listens on as the kernel reports them (every listening
// socket the process owns, whichever library opened it: no backend seam is
// opened for the test). Then ranks 0 and 2 stream real calls to rank 1, and
// rank 1 to rank 2, while rank 0 also plays the stranger: plain TCP clients
// (and, where the backend's test gives one, a client of its transport) that
// send what the case says. Every case asserts that
//   - rank 1 survives and every call alongside succeeded;
//   - what the stranger sent that the worker cannot accept is refused: the
//     worker ends that connection (or stream) within kRefuseBound while the
//     stranger keeps it open;
//   - once the stranger has gone, rank 1's descriptors come back to the
//     baseline and malloc's bytes to within kMemorySlack of it (waited for
//     up to kSettleBound: the kernel and the libraries close in their time).
// Rank 1 prints its numbers (descriptors, RssAnon, malloc) for the docs.
//
// Cases: random bytes, huge and negative length prefixes, truncated frames,
// 1000 idle connections, a slow sender, 300 connect/close cycles, frames
// before authentication (the group then shares a secret). The environment
// variable TETHER_HOSTILE_SCALE (default 1) multiplies the connection
// counts for a longer run.
//
// Linked once per backend as a one-line test, with what the backend's own
// protocol adds (a HostileDialect, or an empty one):
//
//   // backends/foo/foo_hostile_test.cc
//   TETHER_HOSTILE_PEERS_TEST(Foo, tether::backends::foo_backend(),
//                             tether::backends::foo_hostile_dialect());
#ifndef TETHER_TESTING_HOSTILE_PEERS_H_
#define TETHER_TESTING_HOSTILE_PEERS_H_

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>

#include "core/backend_registry.h"
#include "testing/hostile_dialect.h"

namespace tether::testing {

// The parameter of the suite: the backend under test and its dialect.
struct HostileParam {
  std::string label;
  std::function<Backend()> backend;
  std::function<HostileDialect()> dialect;

  friend void PrintTo(const HostileParam& param, std::ostream* out) {
    *out << param.label;
  }
};

// Skips every test, saying why, when the backend is not viable here.
class HostilePeers : public ::testing::TestWithParam<HostileParam> {
 protected:
  void SetUp() override;
};

}  // namespace tether::testing

#define TETHER_HOSTILE_PEERS_TEST(suite, backend_expr, dialect_expr)  \
  namespace tether::testing {                                         \
  INSTANTIATE_TEST_SUITE_P(                                           \
      suite, HostilePeers,                                            \
      ::testing::Values(HostileParam{#suite,                          \
                                     [] { return (backend_expr); },   \
                                     [] { return (dialect_expr); }}), \
      [](const auto& info) { return info.param.label; });             \
  }  // namespace tether::testing

#endif  // TETHER_TESTING_HOSTILE_PEERS_H_
