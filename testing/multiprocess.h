// Multi-process tests: a gtest test body that runs in N worker processes.
//
//   TEST(TensorPipe, Ring) {
//     run_in_processes(4, [](int rank, int world_size) {
//       ... init_rpc over env://, calls, EXPECT_..., shutdown ...
//     });
//   }
//
// The test binary re-executes itself once per rank, filtered to the current
// test, with MASTER_ADDR/MASTER_PORT (a free port: parallel tests do not
// collide), RANK and WORLD_SIZE set, exactly as tools/tether_run sets them.
// In a worker, run_in_processes runs `body` and exits with 0 only if no
// expectation failed. In the parent, it waits for every worker up to
// `deadline`, kills them all when one fails or the deadline passes, and
// records a failure naming the rank; a worker's output goes to the test log
// prefixed by its rank.
#ifndef TETHER_TESTING_MULTIPROCESS_H_
#define TETHER_TESTING_MULTIPROCESS_H_

#include <absl/time/time.h>

#include <functional>
#include <vector>

namespace tether::testing {

// `may_die` lists ranks whose death (a fault test kills them) is not a
// failure and does not stop the others.
void run_in_processes(int world_size,
                      const std::function<void(int rank, int world_size)>& body,
                      absl::Duration deadline = absl::Seconds(120),
                      const std::vector<int>& may_die = {});

// True inside a worker process started by run_in_processes.
bool in_worker_process();

}  // namespace tether::testing

#endif  // TETHER_TESTING_MULTIPROCESS_H_
