// Three workers in one process over the loopback backend: the whole call path
// (codec, agent, dispatcher, errors, timeouts, shutdown) for real.
#include "core/worker.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/library.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include "backends/builtin.h"
#include "core/ivalue_future.h"
#include "core/rpc.h"
#include "core/status_macros.h"
#include "testing/status_matchers.h"
#include "testing/test_ops.h"

namespace tether {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

std::string unique_init_method() {
  static std::atomic<int> counter{0};
  return absl::StrCat("memory://worker_test_", counter++);
}

RpcOptions loopback_options(const std::string& init_method) {
  RpcOptions options;
  options.backend = "loopback";
  options.init_method = init_method;
  options.num_worker_threads = 4;
  options.default_timeout = kBound;
  options.init_timeout = kBound;
  options.shutdown_timeout = kBound;
  return options;
}

// Makes `names.size()` workers concurrently (each waits for the others).
std::vector<absl::StatusOr<std::unique_ptr<Worker>>> make_workers(
    const std::vector<std::string>& names, const RpcOptions& options,
    int world_size) {
  BackendRegistry registry;
  EXPECT_THAT(backends::register_builtin_backends(registry), IsOk());
  std::vector<absl::StatusOr<std::unique_ptr<Worker>>> workers;
  for (size_t i = 0; i < names.size(); ++i) {
    workers.emplace_back(absl::UnknownError("not made"));
  }
  std::vector<std::thread> threads;
  for (size_t rank = 0; rank < names.size(); ++rank) {
    threads.emplace_back([&, rank] {
      workers[rank] = Worker::create(names[rank], static_cast<int>(rank),
                                     world_size, options, registry);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return workers;
}

class ThreeWorkers : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = make_workers({"alice", "bob", "carol"},
                             loopback_options(unique_init_method()), 3);
    for (auto& worker : made) {
      ASSERT_THAT(worker, IsOk());
      workers_.push_back(std::move(*worker));
    }
  }

  void TearDown() override {
    std::vector<std::thread> threads;
    std::vector<absl::Status> results(workers_.size());
    for (size_t i = 0; i < workers_.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = workers_[i]->shutdown(); });
    }
    for (std::thread& thread : threads) thread.join();
    for (const absl::Status& result : results) EXPECT_THAT(result, IsOk());
  }

  Worker& alice() { return *workers_[0]; }
  Worker& bob() { return *workers_[1]; }

  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_F(ThreeWorkers, BuiltinAdd) {
  at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor b = at::ones({2, 3});
  absl::StatusOr<c10::IValue> sum =
      alice().rpc_sync("bob", "aten::add.Tensor", {a, b});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(sum->toTensor(), a + b));
}

TEST_F(ThreeWorkers, KeywordArgumentsAndDefaults) {
  at::Tensor a = at::ones({3});
  absl::StatusOr<c10::IValue> sum = alice().rpc_sync(
      "carol", "aten::add.Tensor", {a, a}, {{"alpha", c10::IValue(3)}});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(sum->toTensor(), at::full({3}, 4.0)));
}

TEST_F(ThreeWorkers, TargetByNameRankOrWorkerInfo) {
  at::Tensor a = at::ones({2});
  for (const To& to : {To("bob"), To(1), To(WorkerInfo{"bob", 1})}) {
    absl::StatusOr<c10::IValue> who = alice().rpc_sync(to, "tether_test::whoami", {});
    ASSERT_THAT(who, IsOk());
    EXPECT_EQ(who->toStringRef(), "bob");
  }
}

TEST_F(ThreeWorkers, UserOperator) {
  at::Tensor x = at::randn({4, 5});
  absl::StatusOr<c10::IValue> scaled =
      alice().rpc_sync("carol", "tether_test::scale", {x, 2.5});
  ASSERT_THAT(scaled, IsOk());
  EXPECT_TRUE(at::allclose(scaled->toTensor(), x * 2.5));
}

TEST_F(ThreeWorkers, TorchScriptFunction) {
  ASSERT_THAT(bob().register_script(R"(
def affine(x: Tensor, w: float, b: float) -> Tensor:
    return x * w + b
)"),
              IsOk());
  at::Tensor x = at::arange(4, at::kDouble);
  absl::StatusOr<c10::IValue> y =
      alice().rpc_sync("bob", "affine", {x, 2.0, 1.0});
  ASSERT_THAT(y, IsOk());
  EXPECT_TRUE(at::equal(y->toTensor(), x * 2 + 1));
  // Only the worker that compiled it serves it.
  EXPECT_THAT(alice().rpc_sync("carol", "affine", {x, 2.0, 1.0}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("affine")));
}

TEST_F(ThreeWorkers, ScriptThatDoesNotCompileIsRejected) {
  EXPECT_THAT(bob().register_script("def broken(x: Tensor) -> Tensor:\n  return y\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not compile")));
}

TEST_F(ThreeWorkers, SelfCall) {
  absl::StatusOr<c10::IValue> who =
      alice().rpc_sync("alice", "tether_test::whoami", {});
  ASSERT_THAT(who, IsOk());
  EXPECT_EQ(who->toStringRef(), "alice");
}

TEST_F(ThreeWorkers, NestedCallFromInsideAnOperator) {
  // alice asks bob to run add_via, which calls carol from bob's worker.
  at::Tensor a = at::full({3}, 2.0);
  at::Tensor b = at::full({3}, 5.0);
  absl::StatusOr<c10::IValue> sum = alice().rpc_sync(
      "bob", "tether_test::add_via", {std::string("carol"), a, b});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(sum->toTensor(), at::full({3}, 7.0)));
}

TEST_F(ThreeWorkers, ThousandConcurrentAsyncCalls) {
  constexpr int kCalls = 1000;
  std::vector<Future<c10::IValue>> futures;
  futures.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    futures.push_back(alice().rpc_async(
        i % 2 == 0 ? "bob" : "carol", "aten::add.Tensor",
        {at::full({2}, static_cast<double>(i)), at::ones({2})}));
  }
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<c10::IValue> sum = futures[i].get(absl::Now() + kBound);
    ASSERT_THAT(sum, IsOk()) << "call " << i;
    EXPECT_EQ(sum->toTensor()[0].item<double>(), i + 1.0);
  }
}

TEST_F(ThreeWorkers, UnknownOperatorIsNotFoundNamingIt) {
  EXPECT_THAT(alice().rpc_sync("bob", "aten::no_such_op", {at::ones({1})}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("aten::no_such_op"), HasSubstr("bob"))));
}

TEST_F(ThreeWorkers, WrongArgumentTypeIsInvalidArgumentNamingIt) {
  EXPECT_THAT(
      alice().rpc_sync("bob", "tether_test::scale",
                       {at::ones({2}), std::string("not a number")}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("factor")));
  EXPECT_THAT(alice().rpc_sync("bob", "tether_test::scale", {at::ones({2})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("factor")));
}

TEST_F(ThreeWorkers, ThrowingOperatorNamesWorkerAndOperator) {
  EXPECT_THAT(
      alice().rpc_sync("carol", "tether_test::fail", {at::ones({3})}),
      StatusIs(absl::StatusCode::kUnknown,
               AllOf(HasSubstr("carol"), HasSubstr("tether_test::fail"),
                     HasSubstr("fail was asked to fail on a tensor of 3"))));
}

TEST_F(ThreeWorkers, SlowOperatorWithShortTimeoutIsDeadlineExceeded) {
  absl::Time start = absl::Now();
  EXPECT_THAT(alice().rpc_sync("bob", "tether_test::slow", {int64_t{1000}}, {},
                               absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("tether_test::slow")));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
}

TEST_F(ThreeWorkers, DefaultTimeoutApplies) {
  auto made = make_workers({"quick"}, [] {
    RpcOptions options = loopback_options(unique_init_method());
    options.default_timeout = absl::Milliseconds(100);
    return options;
  }(), 1);
  ASSERT_THAT(made[0], IsOk());
  Worker& quick = **made[0];
  EXPECT_THAT(quick.rpc_sync("quick", "tether_test::slow", {int64_t{800}}),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // An explicit zero means no timeout.
  EXPECT_THAT(quick.rpc_sync("quick", "tether_test::slow", {int64_t{200}}, {},
                             absl::ZeroDuration()),
              IsOk());
  EXPECT_THAT(quick.shutdown(), IsOk());
}

TEST_F(ThreeWorkers, UnknownWorkerIsNotFound) {
  EXPECT_THAT(alice().rpc_sync("dave", "aten::add.Tensor", {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("dave")));
  EXPECT_THAT(alice().rpc_sync(7, "aten::add.Tensor", {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("7")));
}

TEST_F(ThreeWorkers, WorkerInfos) {
  EXPECT_EQ(bob().get_current_worker_info().name, "bob");
  EXPECT_EQ(bob().get_current_worker_info().id, 1);
  ASSERT_EQ(bob().get_all_worker_infos().size(), 3u);
  EXPECT_EQ(bob().get_all_worker_infos()[2].name, "carol");
  absl::StatusOr<WorkerInfo> info = bob().get_worker_info("alice");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->id, 0);
}

// Regression: a worker draining for graceful shutdown still serves calls
// that call onward (bob's operator calls carol while bob is shutting down).
TEST_F(ThreeWorkers, NestedCallsStillGoOutWhileDraining) {
  Future<c10::IValue> slow_then_nested = alice().rpc_async(
      "bob", "tether_test::slow_then_add_via", {std::string("carol")});
  // bob (and everyone) starts the graceful shutdown while the call runs.
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(workers_.size());
  for (size_t i = 0; i < workers_.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = workers_[i]->shutdown(); });
  }
  absl::StatusOr<c10::IValue> sum = slow_then_nested.get(absl::Now() + kBound);
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& result : results) EXPECT_THAT(result, IsOk());
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(sum->toTensor(), at::full({2}, 2.0)));
}

TEST_F(ThreeWorkers, CallsAfterShutdownAreCancelled) {
  // Non-graceful shutdown is local and immediate.
  ASSERT_THAT(alice().shutdown(/*graceful=*/false), IsOk());
  EXPECT_THAT(alice().rpc_sync("bob", "tether_test::whoami", {}),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("shut down")));
  // Peers calling the stopped worker get an error, not a hang.
  EXPECT_FALSE(bob().rpc_sync("alice", "tether_test::whoami", {}).ok());
  // The remaining two still shut down gracefully; alice counts as gone.
  workers_.erase(workers_.begin());
  for (auto& worker : workers_) {
    ASSERT_THAT(worker->shutdown(/*graceful=*/false), IsOk());
  }
}

TEST(WorkerInit, BadNamesRanksAndBackendsAreClearErrors) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  RpcOptions options = loopback_options(unique_init_method());
  EXPECT_THAT(Worker::create("bad name!", 0, 1, options, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad name!")));
  EXPECT_THAT(Worker::create("w", 2, 2, options, registry),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2")));
  RpcOptions unknown = options;
  unknown.backend = "carrier_pigeon";
  EXPECT_THAT(Worker::create("w", 0, 1, unknown, registry),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("carrier_pigeon"), HasSubstr("loopback"))));
}

TEST(WorkerInit, DuplicateNameFailsEveryRankAtOnce) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  RpcOptions options = loopback_options(unique_init_method());
  options.init_timeout = absl::Seconds(60);
  // Whichever claims the name second is refused, and the other learns why
  // at once instead of waiting out the init timeout.
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] =
          Worker::create("twin", rank, 2, options, registry).status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (const absl::Status& result : results) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kAlreadyExists,
                                 HasSubstr("worker name 'twin'")));
  }
}

// A peer that closes a socket first must not kill this process: a write to
// it fails with EPIPE (TensorPipe's shm transport writes without
// MSG_NOSIGNAL).
TEST(WorkerInit, AWriteToAClosedSocketIsAnErrorNotADeath) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  ::signal(SIGPIPE, SIG_DFL);  // as a program starts
  auto worker = Worker::create("solo", 0, 1,
                               loopback_options(unique_init_method()), registry);
  ASSERT_THAT(worker, IsOk());
  int ends[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, ends), 0);
  ::close(ends[1]);
  EXPECT_EQ(::write(ends[0], "x", 1), -1);
  EXPECT_EQ(errno, EPIPE);
  ::close(ends[0]);
  EXPECT_THAT((*worker)->shutdown(), IsOk());
}

TEST(WorkerInit, MissingPeerTimesOutNamingIt) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  RpcOptions options = loopback_options(unique_init_method());
  options.init_timeout = absl::Milliseconds(200);
  EXPECT_THAT(Worker::create("lonely", 0, 3, options, registry),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("rank(s) 1, 2")));
}

// An operator that answers later, as TORCH_LIBRARY users write one: its
// result is a Future(Tensor), here already complete (or failed, for x < 0).
void doubled_later(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  at::Tensor x = stack->back().toTensor();
  stack->pop_back();
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  if (x.lt(0).any().item<bool>()) {
    future->setError(std::make_exception_ptr(std::runtime_error("negative")));
  } else {
    future->markCompleted(x * 2);
  }
  stack->emplace_back(future);
}

TORCH_LIBRARY(tether_worker_test, m) {
  m.def("doubled_later(Tensor x) -> Future(Tensor)",
        torch::CppFunction::makeFromBoxedFunction<&doubled_later>());
}

TEST_F(ThreeWorkers, RegisteredFunctionsAndLambdas) {
  ASSERT_THAT(bob().register_function(
                  "my_add", [](at::Tensor a, at::Tensor b) { return a + b; }),
              IsOk());
  absl::StatusOr<c10::IValue> sum =
      alice().rpc_sync("bob", "my_add", {at::ones({2}), at::ones({2})});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(sum->toTensor(), at::full({2}, 2.0)));
  EXPECT_THAT(alice().rpc_sync("bob", "my_add", {at::ones({2}), 1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("bob"), HasSubstr("my_add"),
                             HasSubstr("position 1"),
                             HasSubstr("must be Tensor, got int"))));
  // Only the worker that registered it serves it.
  EXPECT_THAT(alice().rpc_sync("carol", "my_add", {at::ones({2}), at::ones({2})}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("my_add")));
  // prim:: operators and the peer's builtins across workers.
  absl::StatusOr<c10::IValue> min = alice().rpc_sync("carol", "min", {1, 2});
  ASSERT_THAT(min, IsOk());
  EXPECT_EQ(min->toInt(), 1);
  absl::StatusOr<c10::IValue> max = alice().rpc_sync("carol", "prim::max", {1, 2});
  ASSERT_THAT(max, IsOk());
  EXPECT_EQ(max->toInt(), 2);
}

TEST_F(ThreeWorkers, OperatorReturningAFutureIsAnsweredWithItsValue) {
  absl::StatusOr<c10::IValue> doubled = alice().rpc_sync(
      "bob", "tether_worker_test::doubled_later", {at::ones({2})});
  ASSERT_THAT(doubled, IsOk());
  EXPECT_TRUE(at::equal(doubled->toTensor(), at::full({2}, 2.0)));
  EXPECT_THAT(alice().rpc_sync("bob", "tether_worker_test::doubled_later",
                               {-at::ones({2})}),
              StatusIs(absl::StatusCode::kUnknown,
                       AllOf(HasSubstr("bob"), HasSubstr("negative"))));
}

// Calls that park until released: each returns a future that "release"
// completes, so none holds a pool thread while it waits.
struct Parking {
  absl::Mutex mu;
  std::vector<std::pair<Promise<c10::IValue>, int64_t>> parked
      ABSL_GUARDED_BY(mu);
  Promise<bool> all_parked;
  size_t expected = 0;
};

TEST_F(ThreeWorkers, AsyncFunctionsDoNotHoldAPoolThread) {
  auto parking = std::make_shared<Parking>();
  parking->expected = 12;  // three times bob's pool (4 threads)
  ASSERT_THAT(bob().register_function(
                  "park",
                  [parking](int64_t x) -> Future<c10::IValue> {
                    Promise<c10::IValue> promise;
                    absl::MutexLock lock(&parking->mu);
                    parking->parked.emplace_back(promise, x);
                    if (parking->parked.size() == parking->expected) {
                      parking->all_parked.set(true);
                    }
                    return promise.future();
                  }),
              IsOk());
  ASSERT_THAT(bob().register_function("release",
                                      [parking]() {
                                        absl::MutexLock lock(&parking->mu);
                                        for (auto& [promise, x] : parking->parked) {
                                          promise.set(c10::IValue(x * 10));
                                        }
                                        return static_cast<int64_t>(
                                            parking->parked.size());
                                      }),
              IsOk());
  std::vector<Future<c10::IValue>> futures;
  for (int64_t i = 0; i < 12; ++i) {
    futures.push_back(alice().rpc_async("bob", "park", {i}));
  }
  // Had each parked call held one of bob's 4 pool threads, the fifth would
  // never run.
  ASSERT_THAT(parking->all_parked.future().get(absl::Now() + kBound), IsOk());
  for (const Future<c10::IValue>& future : futures) {
    EXPECT_FALSE(future.is_ready());
  }
  absl::StatusOr<c10::IValue> released = alice().rpc_sync("bob", "release", {});
  ASSERT_THAT(released, IsOk());
  EXPECT_EQ(released->toInt(), 12);
  for (int64_t i = 0; i < 12; ++i) {
    absl::StatusOr<c10::IValue> value = futures[i].get(absl::Now() + kBound);
    ASSERT_THAT(value, IsOk());
    EXPECT_EQ(value->toInt(), i * 10);
  }
}

TEST_F(ThreeWorkers, AsyncFunctionsChainAcrossWorkers) {
  // alice -> bob's relay, which calls carol and hands back that call's future.
  ASSERT_THAT(bob().register_function(
                  "relay",
                  [](std::string to, std::string fn, at::Tensor x) {
                    return rpc_async(to, fn, {x, 1});
                  }),
              IsOk());
  absl::StatusOr<c10::IValue> sum = alice().rpc_sync(
      "bob", "relay", {std::string("carol"), std::string("aten::add"),
                       at::ones({2})});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(sum->toTensor(), at::full({2}, 2.0)));
  // carol's error reaches alice with its code, naming both workers.
  EXPECT_THAT(alice().rpc_sync("bob", "relay",
                               {std::string("carol"), std::string("no_such_fn"),
                                at::ones({2})}),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("bob"), HasSubstr("carol"),
                             HasSubstr("no_such_fn"))));
  // Many at once, more than any pool has threads.
  std::vector<Future<c10::IValue>> futures;
  for (int i = 0; i < 64; ++i) {
    futures.push_back(alice().rpc_async(
        "bob", "relay",
        {std::string("carol"), std::string("aten::add"),
         at::full({1}, static_cast<double>(i))}));
  }
  absl::StatusOr<std::vector<c10::IValue>> all =
      wait_all(futures, absl::Now() + kBound);
  ASSERT_THAT(all, IsOk());
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ((*all)[i].toTensor().item<double>(), i + 1.0);
  }
}

TEST_F(ThreeWorkers, AllGatherAndBarrierOverASubset) {
  // alice and carol gather twice over their pair (bob takes no part), then
  // all three meet at a barrier.
  std::vector<absl::StatusOr<std::map<std::string, c10::IValue>>> first(3),
      second(3);
  std::vector<absl::Status> met(3);
  std::vector<std::thread> threads;
  for (int i : {0, 2}) {
    threads.emplace_back([&, i] {
      Worker& w = *workers_[i];
      first[i] = w.all_gather(c10::IValue(int64_t{i}), {"carol", "alice"});
      second[i] = w.all_gather(c10::IValue(int64_t{10 + i}), {"alice", "carol"});
      met[i] = w.barrier();
    });
  }
  threads.emplace_back([&] { met[1] = bob().barrier({}); });
  for (std::thread& t : threads) t.join();
  for (int i : {0, 2}) {
    ASSERT_THAT(first[i], IsOk());
    ASSERT_THAT(second[i], IsOk());
    ASSERT_EQ(first[i]->size(), 2u);
    EXPECT_EQ(first[i]->at("alice").toInt(), 0);
    EXPECT_EQ(first[i]->at("carol").toInt(), 2);
    EXPECT_EQ(second[i]->at("alice").toInt(), 10);
    EXPECT_EQ(second[i]->at("carol").toInt(), 12);
  }
  for (const absl::Status& s : met) EXPECT_THAT(s, IsOk());
  EXPECT_THAT(alice().all_gather(c10::IValue(1), {"bob", "carol"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("without it")));
  EXPECT_THAT(alice().barrier({"alice", "dave"}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("dave")));
  // A member that never comes: the timeout names it.
  EXPECT_THAT(alice().barrier({"alice", "bob"}, absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("bob")));
}

TEST(Collectives, ALostMemberEndsTheWaitNamingIt) {
  RpcOptions options = loopback_options(unique_init_method());
  options.peer_timeout = absl::Seconds(2);
  auto made = make_workers({"alice", "bob", "carol"}, options, 3);
  for (auto& w : made) ASSERT_THAT(w, IsOk());
  // bob is gone before alice (the leader of alice and bob) waits for him.
  ASSERT_THAT((*made[1])->shutdown(/*graceful=*/false), IsOk());
  const absl::Time start = absl::Now();
  EXPECT_THAT((*made[0])->barrier({"alice", "bob"}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("bob")));
  // carol waits for alice, who leads carol and alice and is gone too.
  ASSERT_THAT((*made[0])->shutdown(/*graceful=*/false), IsOk());
  EXPECT_THAT((*made[2])->barrier({"alice", "carol"}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("alice")));
  EXPECT_LT(absl::Now() - start, kBound);
  ASSERT_THAT((*made[2])->shutdown(/*graceful=*/false), IsOk());
}

TEST(FreeFunctions, ActOnTheDefaultWorker) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  EXPECT_THAT(rpc_sync("solo", "aten::add.Tensor", {}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  RpcOptions options = loopback_options(unique_init_method());
  ASSERT_THAT(init_rpc("solo", 0, 1, options, registry), IsOk());
  EXPECT_THAT(init_rpc("solo", 0, 1, options, registry),
              StatusIs(absl::StatusCode::kAlreadyExists));
  absl::StatusOr<c10::IValue> sum =
      rpc_sync("solo", "aten::add.Tensor", {at::ones({2}), at::ones({2})});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(sum->toTensor(), at::full({2}, 2.0)));
  absl::StatusOr<std::vector<WorkerInfo>> all = get_all_worker_infos();
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->size(), 1u);
  EXPECT_THAT(shutdown(), IsOk());
  EXPECT_THAT(shutdown(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace tether

namespace tether {
namespace {

// Two workers with different limits: what a worker refuses to take fails at
// its caller with RESOURCE_EXHAUSTED, and it keeps serving; what a worker
// refuses to send fails before it leaves.
TEST(WorkerLimits, OverTheLimitsIsResourceExhaustedAndTheReceiverStaysUp) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  const std::string init = unique_init_method();
  RpcOptions generous = loopback_options(init);
  RpcOptions tight = loopback_options(init);
  tight.limits.max_payload_bytes = 4096;
  tight.limits.max_storages = 4;
  tight.limits.max_storage_bytes = 1 << 20;
  tight.limits.max_depth = 8;
  absl::StatusOr<std::unique_ptr<Worker>> sender, strict;
  std::thread t0([&] {
    sender = Worker::create("sender", 0, 2, generous, registry);
  });
  std::thread t1([&] { strict = Worker::create("strict", 1, 2, tight, registry); });
  t0.join();
  t1.join();
  ASSERT_THAT(sender, IsOk());
  ASSERT_THAT(strict, IsOk());

  auto refused = [&](const char* fn, std::vector<c10::IValue> args,
                     const char* limit) {
    EXPECT_THAT((*sender)->rpc_sync("strict", fn, std::move(args)),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         AllOf(HasSubstr("worker 'strict' refuses"),
                               HasSubstr(limit))))
        << fn;
  };
  refused("aten::len.str", {std::string(10000, 'x')}, "max_payload_bytes");
  std::vector<at::Tensor> many;
  for (int i = 0; i < 10; ++i) many.push_back(at::full({2}, i));
  refused("aten::cat", {c10::IValue(many), int64_t{0}}, "max_storages");
  refused("aten::neg", {at::ones({1 << 19})}, "max_storage_bytes");
  c10::IValue nested = testing::nested_lists(21);
  // Nesting is the codec's: the callee's decode refuses it.
  EXPECT_THAT((*sender)->rpc_sync("strict", "aten::len.any", {nested}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("Error on worker 1 (strict)"),
                             HasSubstr("nested deeper than 8"))));
  // Still serving.
  absl::StatusOr<c10::IValue> fine = (*sender)->rpc_sync(
      "strict", "aten::add.Tensor", {at::ones({2}), at::ones({2})});
  ASSERT_THAT(fine, IsOk());
  // The strict worker does not send what it would not take.
  EXPECT_THAT((*strict)->rpc_sync("sender", "aten::neg", {at::ones({1 << 19})}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("limit max_storage_bytes")));
  std::thread s0([&] { EXPECT_THAT((*sender)->shutdown(), IsOk()); });
  std::thread s1([&] { EXPECT_THAT((*strict)->shutdown(), IsOk()); });
  s0.join();
  s1.join();
}

// Nesting is one limit (RpcOptions::limits.max_depth) checked alike by
// sender and callee, always RESOURCE_EXHAUSTED naming it: a call's argument
// sits 2 deep in the message (the call tuple and the args tuple).
TEST(WorkerLimits, NestingIsOneLimitCheckedAlikeBySenderAndCallee) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  const std::string init = unique_init_method();
  RpcOptions deep = loopback_options(init);
  deep.limits.max_depth = wire::kMaxSupportedDepth;
  RpcOptions usual = loopback_options(init);  // max_depth 64
  absl::StatusOr<std::unique_ptr<Worker>> a, b;
  std::thread t0([&] { a = Worker::create("a", 0, 2, deep, registry); });
  std::thread t1([&] { b = Worker::create("b", 1, 2, usual, registry); });
  t0.join();
  t1.join();
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  const auto kExhausted = absl::StatusCode::kResourceExhausted;
  // Within b's limit both ways.
  EXPECT_THAT((*b)->rpc_sync("a", testing::kNesting, {testing::nested_lists(62)}),
              IsOk());
  EXPECT_THAT((*a)->rpc_sync("b", testing::kNesting, {testing::nested_lists(62)}),
              IsOk());
  // One more: b refuses to send it, and refuses to take it from a, alike.
  EXPECT_THAT((*b)->rpc_sync("a", testing::kNesting, {testing::nested_lists(63)}),
              StatusIs(kExhausted, AllOf(HasSubstr("nested deeper than 64"),
                                         HasSubstr("max_depth"))));
  for (int depth : {63, 64, 200, wire::kMaxSupportedDepth - 2}) {
    EXPECT_THAT((*a)->rpc_sync("b", testing::kNesting, {testing::nested_lists(depth)}),
                StatusIs(kExhausted,
                         AllOf(HasSubstr("Error on worker 1 (b)"),
                               HasSubstr("nested deeper than 64"),
                               HasSubstr("max_depth"))))
        << depth;
  }
  // Deeper than the codec goes at all: refused by the sender.
  EXPECT_THAT((*a)->rpc_sync("b", testing::kNesting, {testing::nested_lists(10000)}),
              StatusIs(kExhausted, HasSubstr("nested deeper than 256")));
  std::thread s0([&] { EXPECT_THAT((*a)->shutdown(), IsOk()); });
  std::thread s1([&] { EXPECT_THAT((*b)->shutdown(), IsOk()); });
  s0.join();
  s1.join();
}

TEST(WorkerLimits, CallsInFlightAreBounded) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  RpcOptions options = loopback_options(unique_init_method());
  options.max_calls_in_flight = 2;
  std::vector<absl::StatusOr<std::unique_ptr<Worker>>> workers =
      make_workers({"a", "b"}, options, 2);
  for (auto& w : workers) ASSERT_THAT(w, IsOk());
  Worker& a = **workers[0];
  Future<c10::IValue> first = a.rpc_async("b", testing::kSlow, {int64_t{300}});
  Future<c10::IValue> second = a.rpc_async("b", testing::kSlow, {int64_t{300}});
  EXPECT_THAT(a.rpc_sync("b", testing::kSlow, {int64_t{1}}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_calls_in_flight")));
  ASSERT_THAT(first.get(), IsOk());
  ASSERT_THAT(second.get(), IsOk());
  EXPECT_THAT(a.rpc_sync("b", testing::kSlow, {int64_t{1}}), IsOk());
  options.max_calls_in_flight = -1;
  EXPECT_THAT(Worker::create("x", 0, 1, options, registry),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_calls_in_flight")));
  std::vector<std::thread> threads;
  for (auto& w : workers) {
    threads.emplace_back([&w] { EXPECT_THAT((*w)->shutdown(), IsOk()); });
  }
  for (auto& t : threads) t.join();
}

// Which requests count against max_calls_in_flight is the registering
// layer's word (HandlerTraits), not a list of types in core: a type
// registered as a call is bounded, one registered without is not.
TEST(WorkerLimits, HandlersSayWhetherTheirRequestsCountAsCalls) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  RpcOptions options = loopback_options(unique_init_method());
  options.max_calls_in_flight = 1;
  // The handlers answer when the test says so: no thread waits meanwhile.
  Promise<Message> answer;
  // Two message types of a layer of this test's own, named as a layer names
  // its types.
  constexpr MessageType kCounted{40};
  constexpr MessageType kNotCounted{41};
  ASSERT_TRUE(register_message_type_names(
      {{kCounted, "TEST_COUNTED"}, {kNotCounted, "TEST_NOT_COUNTED"}}));
  EXPECT_STREQ(message_type_name(kCounted), "TEST_COUNTED");
  ExtensionFactory handlers =
      [answer](Worker& worker)
      -> absl::StatusOr<std::unique_ptr<WorkerExtension>> {
    RequestHandler later = [answer](Message) { return answer.future(); };
    HandlerTraits call;
    call.counts_as_call = true;
    TETHER_RETURN_IF_ERROR(
        worker.register_handler(kCounted, later, call));
    TETHER_RETURN_IF_ERROR(
        worker.register_handler(kNotCounted, later));
    return std::make_unique<WorkerExtension>();
  };
  std::vector<absl::StatusOr<std::unique_ptr<Worker>>> workers(2);
  std::vector<std::thread> makers;
  for (int rank = 0; rank < 2; ++rank) {
    makers.emplace_back([&, rank] {
      workers[rank] = Worker::create(rank == 0 ? "a" : "b", rank, 2, options,
                                     registry, {handlers});
    });
  }
  for (std::thread& t : makers) t.join();
  for (auto& w : workers) ASSERT_THAT(w, IsOk());
  Worker& a = **workers[0];
  absl::StatusOr<WorkerInfo> b = a.get_worker_info("b");
  ASSERT_THAT(b, IsOk());
  auto request = [](MessageType type) {
    Message message;
    message.type = type;
    return message;
  };
  Future<Message> counted = a.send(*b, request(kCounted));
  EXPECT_THAT(a.send(*b, request(kCounted)).get(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_calls_in_flight")));
  Future<Message> not_counted = a.send(*b, request(kNotCounted));
  answer.set(ack());
  EXPECT_THAT(counted.get(absl::Now() + kBound), IsOk());
  EXPECT_THAT(not_counted.get(absl::Now() + kBound), IsOk());
  std::vector<std::thread> threads;
  for (auto& w : workers) {
    threads.emplace_back([&w] { EXPECT_THAT((*w)->shutdown(), IsOk()); });
  }
  for (auto& t : threads) t.join();
}

TEST(FreeFunctions, TypedResultsTimeoutsAndStatusMacros) {
  BackendRegistry registry;
  ASSERT_THAT(backends::register_builtin_backends(registry), IsOk());
  EXPECT_THAT(get_rpc_timeout(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  RpcOptions options = loopback_options(unique_init_method());
  ASSERT_THAT(init_rpc("solo", 0, 1, options, registry), IsOk());
  const at::Tensor a = at::ones({2});
  absl::StatusOr<at::Tensor> sum =
      rpc_sync<at::Tensor>("solo", "aten::add.Tensor", {a, a});
  ASSERT_THAT(sum, IsOk());
  EXPECT_TRUE(at::equal(*sum, a * 2));
  EXPECT_THAT(rpc_sync<int64_t>("solo", "aten::add.Tensor", {a, a}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the result of 'aten::add.Tensor' is a "
                                 "Tensor, not int")));
  absl::StatusOr<double> widened =
      rpc_sync<double>("solo", testing::kSlow, {int64_t{1}});
  ASSERT_THAT(widened, IsOk());
  EXPECT_EQ(*widened, 1.0);
  EXPECT_THAT(rpc_sync<std::vector<at::Tensor>>("solo", "aten::add.Tensor",
                                                {a, a}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not Tensor[]")));

  // The timeout of later calls changes on the running worker.
  EXPECT_THAT(get_rpc_timeout(), IsOk());
  EXPECT_EQ(*get_rpc_timeout(), kBound);
  ASSERT_THAT(set_rpc_timeout(absl::Milliseconds(50)), IsOk());
  EXPECT_EQ(*get_rpc_timeout(), absl::Milliseconds(50));
  EXPECT_THAT(rpc_sync("solo", testing::kSlow, {int64_t{2000}}),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_THAT(set_rpc_timeout(absl::ZeroDuration()), IsOk());  // none
  EXPECT_EQ(*get_rpc_timeout(), absl::ZeroDuration());
  EXPECT_THAT(rpc_sync("solo", testing::kSlow, {int64_t{100}}), IsOk());

  auto twice_sum = [&]() -> absl::StatusOr<at::Tensor> {
    TETHER_ASSIGN_OR_RETURN(at::Tensor once,
                            rpc_sync<at::Tensor>("solo", "aten::add.Tensor",
                                                 {a, a}));
    TETHER_RETURN_IF_ERROR(get_worker_info("solo").status());
    return once * 2;
  };
  EXPECT_THAT(twice_sum(), IsOk());
  auto failing = [&]() -> absl::StatusOr<int64_t> {
    TETHER_ASSIGN_OR_RETURN(int64_t n, rpc_sync<int64_t>("solo",
                                                         "aten::add.Tensor",
                                                         {a, a}));
    return n;
  };
  EXPECT_THAT(failing(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(shutdown(), IsOk());
}

}  // namespace
}  // namespace tether
