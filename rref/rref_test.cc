// The RRef protocol between three workers in one process over loopback.
#include "rref/rref.h"

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/synchronization/notification.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <atomic>
#include <thread>

#include "core/profiling.h"
#include "core/rpc.h"
#include "core/wire/codec.h"
#include "rref/rref_impl.h"
#include "testing/legacy_profile.h"
#include "testing/loopback_group.h"
#include "testing/status_matchers.h"

namespace {

tether::RRef rref_of(const c10::IValue& v) {
  absl::StatusOr<tether::RRef> r = tether::RRef::from_ivalue(v);
  TORCH_CHECK(r.ok(), r.status().ToString());
  return *r;
}

at::Tensor value_of(const c10::IValue& r) {
  absl::StatusOr<c10::IValue> v = rref_of(r).to_here();
  TORCH_CHECK(v.ok(), v.status().ToString());
  return v->toTensor();
}

bool is_confirmed(const c10::IValue& r) {
  return rref_of(r).confirmed_by_owner();
}

c10::IValue make_local(const at::Tensor& t) {
  absl::StatusOr<tether::RRef> r = tether::RRef::local(t * 10);
  TORCH_CHECK(r.ok(), r.status().ToString());
  return r->to_ivalue();
}

// Passes `r` along `path` (one worker per hop); the last one reads it.
at::Tensor forward(const c10::IValue& r, std::vector<std::string> path) {
  if (path.empty()) return value_of(r);
  std::string next = path.front();
  path.erase(path.begin());
  absl::StatusOr<c10::IValue> v = tether::rpc_sync(
      next, "tether_rref_test::forward", {r, c10::IValue(path)});
  TORCH_CHECK(v.ok(), v.status().ToString());
  return v->toTensor();
}

at::Tensor sum_all(const c10::IValue& rrefs) {
  at::Tensor total = at::zeros({2});
  for (const c10::IValue& r : rrefs.toListRef()) total = total + value_of(r);
  return total;
}

// A remote object: created on its owner with remote(), driven by proxies.
struct Counter : torch::CustomClassHolder {
  explicit Counter(int64_t start) : value(start) {}
  int64_t add(int64_t n) { return value += n; }
  at::Tensor scale(const at::Tensor& t) { return t * value; }
  int64_t value;
};

// Runs on another worker: calls the object through the RRef's proxy.
int64_t add_via_proxy(const c10::IValue& r, int64_t n) {
  absl::StatusOr<c10::IValue> v = rref_of(r).rpc_sync().call("add", {n});
  TORCH_CHECK(v.ok(), v.status().ToString());
  return v->toInt();
}

// The storage of the last value slow_ones() made, held weakly: a test sees
// when its owner lets go of it.
c10::weak_intrusive_ptr<c10::StorageImpl>& last_slow_storage() {
  static auto* storage = new c10::weak_intrusive_ptr<c10::StorageImpl>(
      c10::intrusive_ptr<c10::StorageImpl>());
  return *storage;
}

// ones(2) after `ms` ms: a value a fetch arrives before.
at::Tensor slow_ones(int64_t ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  at::Tensor t = at::ones({2});
  last_slow_storage() = c10::weak_intrusive_ptr<c10::StorageImpl>(
      t.storage().getWeakStorageImpl());
  return t;
}

TORCH_LIBRARY(tether_rref_test, m) {
  m.def("slow_ones(int ms) -> Tensor", &slow_ones);
  m.class_<Counter>("Counter")
      .def(torch::init<int64_t>())
      .def("add", &Counter::add)
      .def("scale", &Counter::scale);
  m.def("add_via_proxy(Any r, int n) -> int", &add_via_proxy);
  m.def("value_of(Any r) -> Tensor", &value_of);
  m.def("is_confirmed(Any r) -> bool", &is_confirmed);
  m.def("make_local(Tensor t) -> Any", &make_local);
  m.def("forward(Any r, str[] path) -> Tensor", &forward);
  m.def("sum_all(Any rrefs) -> Tensor", &sum_all);
}

}  // namespace

namespace tether {
namespace {

using ::testing::HasSubstr;
using ::tether::testing::IsOk;
using ::tether::testing::StatusIs;

constexpr absl::Duration kBound = absl::Seconds(30);

// Waits (bounded) until every worker's RRef counts are back to zero.
void expect_released(const std::vector<std::unique_ptr<Worker>>& workers) {
  const absl::Time deadline = absl::Now() + kBound;
  for (const auto& w : workers) {
    for (;;) {
      absl::StatusOr<RRefDebugInfo> info = rref_debug_info(*w);
      ASSERT_THAT(info, IsOk());
      if (info->owners == 0 && info->forks == 0 && info->pending_users == 0 &&
          info->pending_children == 0) {
        break;
      }
      ASSERT_LT(absl::Now(), deadline)
          << w->get_current_worker_info().name << " still has "
          << info->owners << " owners, " << info->forks << " forks, "
          << info->pending_users << " pending users, "
          << info->pending_children << " pending children";
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
}

class RRefs : public testing::LoopbackGroup {
 protected:
  virtual RRefOptions rref_options() { return RRefOptions(); }

  void SetUp() override {
    start(testing::group_options("rref_test"), {"alice", "bob", "carol"},
          {rref_extension(rref_options())});
  }

  absl::Status shutdown_all() { return testing::shutdown_group(workers_); }

  void expect_all_released() { expect_released(workers_); }
};



TEST_F(RRefs, RemoteThenToHere) {
  absl::StatusOr<RRef> r = remote(*workers_[0], "bob", "aten::add.Tensor",
                                  {at::ones({2}), at::ones({2})});
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->is_owner());
  EXPECT_EQ(r->owner_name(), "bob");
  absl::StatusOr<c10::IValue> v = r->to_here();
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 2.0)));
  EXPECT_THAT(r->local_value(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("bob")));
}

// A remote() of a builtin operator, its fetch and its user's delete are
// served on the thread they arrive on, as a small CALL is: they are
// answered, and the owner let go, while every pool thread of the owner is
// busy with a user function.
TEST_F(RRefs, BuiltinRemoteFetchAndDeleteNeedNoPoolThread) {
  constexpr int kPoolThreads = 8;  // testing::group_options
  auto release = std::make_shared<absl::Notification>();
  auto holding = std::make_shared<std::atomic<int>>(0);
  ASSERT_THAT(workers_[1]->register_function("hold",
                                             [release, holding]() {
                                               ++*holding;
                                               release->WaitForNotification();
                                               return int64_t{1};
                                             }),
              IsOk());
  std::vector<Future<c10::IValue>> held;
  for (int i = 0; i < kPoolThreads; ++i) {
    held.push_back(workers_[0]->rpc_async("bob", "hold", {}));
  }
  // A failed ASSERT below must still let the pool threads go, or the
  // workers' shutdown would wait for them.
  struct LetGo {
    std::shared_ptr<absl::Notification> release;
    ~LetGo() {
      if (!release->HasBeenNotified()) release->Notify();
    }
  } let_go{release};
  const absl::Time deadline = absl::Now() + kBound;
  while (holding->load() < kPoolThreads && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(holding->load(), kPoolThreads);
  absl::StatusOr<RRef> r = remote(*workers_[0], "bob", "aten::add.Tensor",
                                  {at::ones({2}), at::ones({2})});
  ASSERT_THAT(r, IsOk());
  absl::StatusOr<c10::IValue> v = r->to_here(absl::Seconds(5));
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 2.0)));
  *r = RRef();
  auto owners_on_bob = [this]() -> int64_t {
    absl::StatusOr<RRefDebugInfo> info = rref_debug_info(*workers_[1]);
    return info.ok() ? info->owners : -1;
  };
  const absl::Time released_by = absl::Now() + absl::Seconds(5);
  while (owners_on_bob() != 0 && absl::Now() < released_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(owners_on_bob(), 0);
  release->Notify();
  for (const Future<c10::IValue>& call : held) {
    EXPECT_THAT(call.get(absl::Now() + kBound), IsOk());
  }
  expect_all_released();
}

TEST_F(RRefs, RemoteToSelfIsAnOwner) {
  absl::StatusOr<RRef> r = remote(*workers_[0], "alice", "aten::mul.Tensor",
                                  {at::full({2}, 3.0), at::full({2}, 2.0)});
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->is_owner());
  EXPECT_TRUE(r->confirmed_by_owner());
  absl::StatusOr<c10::IValue> v = r->to_here();
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 6.0)));
  ASSERT_THAT(r->local_value(), IsOk());
}

// TorchScript's RRef methods (aten::to_here, aten::local_value, ...) are
// the peer's operators, which cast their RRef to the peer's classes; a
// script function of the worker runs them on tether's RRefs through
// tether's operators of the same names, its own or forwarded.
TEST_F(RRefs, ScriptFunctionsReadTetherRRefs) {
  ASSERT_THAT(workers_[1]->register_script(R"(
def read_rref(r: RRef[Tensor], t: Tensor) -> Tensor:
    return r.to_here() + t

def read_rref_soon(r: RRef[Tensor]) -> Tensor:
    return r.to_here(5.0)

def local_rref(r: RRef[Tensor]) -> Tensor:
    return r.local_value()

def about_rref(r: RRef[Tensor]) -> Tuple[str, bool, bool]:
    return (r.owner_name(), r.is_owner(), r.confirmed_by_owner())

def read_all(rs: List[RRef[Tensor]]) -> Tensor:
    total = torch.zeros(2)
    for r in rs:
        total = total + r.to_here()
    return total

def read_nested(r: RRef[Tensor]) -> Tensor:
    if r.is_owner():
        return local_rref(r) * 2
    return read_rref(r, r.to_here()) * 2
)"),
              IsOk());
  // Owned by carol, read by bob's script: a user's fetch.
  absl::StatusOr<RRef> on_carol = remote(*workers_[0], "carol",
                                         "aten::mul.Tensor",
                                         {at::full({2}, 3.0), at::full({2}, 2.0)});
  ASSERT_THAT(on_carol, IsOk());
  absl::StatusOr<c10::IValue> v =
      workers_[0]->rpc_sync("bob", "read_rref",
               {on_carol->to_ivalue(), at::ones({2})});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 7.0)));
  v = workers_[0]->rpc_sync("bob", "read_rref_soon", {on_carol->to_ivalue()});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 6.0)));
  v = workers_[0]->rpc_sync("bob", "read_nested", {on_carol->to_ivalue()});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 24.0)));
  v = workers_[0]->rpc_sync("bob", "about_rref", {on_carol->to_ivalue()});
  ASSERT_THAT(v, IsOk());
  ASSERT_TRUE(v->isTuple());
  EXPECT_EQ(v->toTupleRef().elements()[0].toStringRef(), "carol");
  EXPECT_FALSE(v->toTupleRef().elements()[1].toBool());
  // In a container.
  absl::StatusOr<RRef> local = remote(*workers_[0], "bob", "aten::mul.Tensor",
                                      {at::full({2}, 5.0), at::ones({2})});
  ASSERT_THAT(local, IsOk());
  c10::impl::GenericList both(c10::AnyType::get());
  both.push_back(on_carol->to_ivalue());
  both.push_back(local->to_ivalue());
  v = workers_[0]->rpc_sync("bob", "read_all", {c10::IValue(both)});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 11.0)));
  // local_value() on a user fails the call naming the owner, as in C++.
  v = workers_[0]->rpc_sync("bob", "local_rref", {on_carol->to_ivalue()});
  EXPECT_THAT(v, StatusIs(absl::StatusCode::kUnknown, HasSubstr("carol")));

  // Owned by bob itself: the owner's value.
  absl::StatusOr<RRef> on_bob = remote(*workers_[0], "bob", "aten::mul.Tensor",
                                       {at::full({2}, 4.0), at::full({2}, 2.0)});
  ASSERT_THAT(on_bob, IsOk());
  v = workers_[0]->rpc_sync("bob", "local_rref", {on_bob->to_ivalue()});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 8.0)));
  v = workers_[0]->rpc_sync("bob", "read_nested", {on_bob->to_ivalue()});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 16.0)));
  v = workers_[0]->rpc_sync("bob", "about_rref", {on_bob->to_ivalue()});
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->toTupleRef().elements()[0].toStringRef(), "bob");
  EXPECT_TRUE(v->toTupleRef().elements()[1].toBool());
  EXPECT_TRUE(v->toTupleRef().elements()[2].toBool());

  // What does not fit is refused, naming it.
  v = workers_[0]->rpc_sync("bob", "read_rref_soon", {at::ones({2})});
  EXPECT_THAT(v, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("argument 'r' is declared RRef[Tensor] "
                                    "but got a Tensor")));
  absl::StatusOr<RRef> holds_int =
      remote(*workers_[0], "carol", "aten::len.t", {c10::List<int64_t>({1, 2})});
  ASSERT_THAT(holds_int, IsOk());
  v = workers_[0]->rpc_sync("bob", "read_rref_soon", {holds_int->to_ivalue()});
  EXPECT_THAT(v, StatusIs(absl::StatusCode::kUnknown,
                          HasSubstr("to_here() in TorchScript gave a int where "
                                    "the function declares RRef[Tensor]")));
}

TEST_F(RRefs, UserPassesItsRRefBackToTheOwner) {
  absl::StatusOr<RRef> r = remote(*workers_[0], "bob", "aten::add.Tensor",
                                  {at::ones({2}), at::ones({2})});
  ASSERT_THAT(r, IsOk());
  absl::StatusOr<c10::IValue> v =
      workers_[0]->rpc_sync("bob", "tether_rref_test::value_of", {*r});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 2.0)));
}

TEST_F(RRefs, UserSharesWithAnotherUserWhoSeesItConfirmed) {
  absl::StatusOr<RRef> r = remote(*workers_[0], "bob", "aten::add.Tensor",
                                  {at::ones({2}), at::ones({2})});
  ASSERT_THAT(r, IsOk());
  // carol receives a fork from alice (a user): it runs only once confirmed.
  absl::StatusOr<c10::IValue> confirmed =
      workers_[0]->rpc_sync("carol", "tether_rref_test::is_confirmed", {*r});
  ASSERT_THAT(confirmed, IsOk());
  EXPECT_TRUE(confirmed->toBool());
  absl::StatusOr<c10::IValue> v =
      workers_[0]->rpc_sync("carol", "tether_rref_test::value_of", {*r});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 2.0)));
}

TEST_F(RRefs, OwnerReturnsItsRRefToAUser) {
  absl::StatusOr<c10::IValue> returned = workers_[0]->rpc_sync(
      "carol", "tether_rref_test::make_local", {at::ones({2})});
  ASSERT_THAT(returned, IsOk());
  absl::StatusOr<RRef> r = RRef::from_ivalue(*returned);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->owner_name(), "carol");
  EXPECT_TRUE(r->confirmed_by_owner());  // the owner registered it first
  absl::StatusOr<c10::IValue> v = r->to_here();
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 10.0)));
}

TEST_F(RRefs, LocalRRefPassedToOtherWorkers) {
  absl::StatusOr<RRef> r = RRef::local(*workers_[0], at::full({2}, 4.0));
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->is_owner());
  absl::StatusOr<c10::IValue> v =
      workers_[0]->rpc_sync("bob", "tether_rref_test::value_of", {*r});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 4.0)));
}

TEST_F(RRefs, ForwardedThroughEightNestedCalls) {
  absl::StatusOr<RRef> r = remote(*workers_[0], "bob", "aten::add.Tensor",
                                  {at::ones({2}), at::full({2}, 6.0)});
  ASSERT_THAT(r, IsOk());
  std::vector<std::string> path = {"carol", "alice", "bob",  "carol",
                                   "alice", "bob",   "carol"};
  absl::StatusOr<c10::IValue> v = workers_[0]->rpc_sync(
      "bob", "tether_rref_test::forward", {*r, c10::IValue(path)});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 7.0)));
}

TEST_F(RRefs, RRefsInsideContainers) {
  std::vector<RRef> refs;
  c10::impl::GenericList list(c10::AnyType::get());
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<RRef> r =
        remote(*workers_[0], i % 2 == 0 ? "bob" : "carol", "aten::add.Tensor",
               {at::full({2}, double(i)), at::ones({2})});
    ASSERT_THAT(r, IsOk());
    refs.push_back(*r);
    list.push_back(r->to_ivalue());
  }
  absl::StatusOr<c10::IValue> v = workers_[0]->rpc_sync(
      "carol", "tether_rref_test::sum_all", {c10::IValue(list)});
  ASSERT_THAT(v, IsOk());
  EXPECT_TRUE(at::equal(v->toTensor(), at::full({2}, 10.0)));
}

TEST_F(RRefs, CreationFailureIsReportedOnFirstUse) {
  absl::StatusOr<RRef> r =
      remote(*workers_[0], "bob", "aten::no_such_op", {at::ones({2})});
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->to_here(), StatusIs(absl::StatusCode::kNotFound,
                                     HasSubstr("RRef creation failed")));
  // Forking it tells the same story: refused at once if the caller has
  // heard of the failure, else reported by the child's first use.
  absl::StatusOr<c10::IValue> forked =
      workers_[0]->rpc_sync("carol", "tether_rref_test::value_of", {*r});
  ASSERT_FALSE(forked.ok());
  EXPECT_THAT(forked.status().message(), HasSubstr("RRef creation failed"));
}

TEST_F(RRefs, CreationFutureReportsSuccessOrTheCreationsError) {
  const absl::Time deadline = absl::Now() + kBound;
  absl::StatusOr<RRef> made = remote(*workers_[0], "bob", "aten::add",
                                     {at::ones({2}), at::ones({2})});
  ASSERT_THAT(made, IsOk());
  EXPECT_THAT(made->get_future().get(deadline), IsOk());
  absl::StatusOr<RRef> failed =
      remote(*workers_[0], "bob", "aten::no_such_op", {at::ones({2})});
  ASSERT_THAT(failed, IsOk());
  EXPECT_THAT(failed->get_future().get(deadline),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("RRef creation failed")));
  // An owner's: its value exists.
  absl::StatusOr<RRef> own = remote(*workers_[0], "alice", "aten::add",
                                    {at::ones({2}), at::ones({2})});
  ASSERT_THAT(own, IsOk());
  EXPECT_THAT(own->get_future().get(deadline), IsOk());
  absl::StatusOr<RRef> own_failed =
      remote(*workers_[0], "alice", "aten::no_such_op", {at::ones({2})});
  ASSERT_THAT(own_failed, IsOk());
  EXPECT_THAT(own_failed->get_future().get(deadline),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("RRef creation failed")));
  absl::StatusOr<RRef> local = RRef::local(*workers_[0], at::ones({1}));
  ASSERT_THAT(local, IsOk());
  EXPECT_TRUE(local->get_future().is_ready());
}

TEST_F(RRefs, RemoteOfAFunctionThatAnswersLater) {
  // bob's "later" returns a future that "release" completes: the RRef is
  // created when it does, and no pool thread of bob waits meanwhile.
  auto parked = std::make_shared<Promise<c10::IValue>>();
  ASSERT_THAT(workers_[1]->register_function(
                  "later", [parked](int64_t) { return parked->future(); }),
              IsOk());
  ASSERT_THAT(workers_[1]->register_function(
                  "release",
                  [parked](at::Tensor value) {
                    parked->set(c10::IValue(value));
                  }),
              IsOk());
  absl::StatusOr<RRef> r = remote(*workers_[0], "bob", "later", {1});
  ASSERT_THAT(r, IsOk());
  Future<bool> created = r->get_future();
  ASSERT_THAT(workers_[2]->rpc_sync("bob", "release", {at::full({2}, 7.0)}),
              IsOk());
  EXPECT_THAT(created.get(absl::Now() + kBound), IsOk());
  absl::StatusOr<c10::IValue> value = r->to_here();
  ASSERT_THAT(value, IsOk());
  EXPECT_TRUE(at::equal(value->toTensor(), at::full({2}, 7.0)));
  // An async function that fails: the RRef's creation fails with its code.
  ASSERT_THAT(workers_[1]->register_function(
                  "relay", [](std::string to, std::string fn) {
                    return rpc_async(to, fn, {});
                  }),
              IsOk());
  absl::StatusOr<RRef> relayed = remote(
      *workers_[0], "bob", "relay", {std::string("carol"), std::string("nope")});
  ASSERT_THAT(relayed, IsOk());
  EXPECT_THAT(relayed->get_future().get(absl::Now() + kBound),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::AllOf(HasSubstr("RRef creation failed"),
                                        HasSubstr("carol"), HasSubstr("nope"))));
  *r = RRef();
  *relayed = RRef();
  expect_all_released();
}

constexpr char kCounter[] = "__torch__.torch.classes.tether_rref_test.Counter";

// A remote() to the caller itself, used at once through a proxy: the
// method call's message may be handled before the REMOTE_CALL's, and must
// still find the value the REMOTE_CALL sets (a race the training example
// hit).
TEST_F(RRefs, RemoteToSelfThenProxyAtOnce) {
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<RRef> counter =
        remote(*workers_[0], "alice", kCounter, {int64_t{i}});
    ASSERT_THAT(counter, IsOk());
    absl::StatusOr<c10::IValue> v =
        counter->rpc_sync(absl::Seconds(5)).call("add", {int64_t{1}});
    ASSERT_THAT(v, IsOk()) << "round " << i;
    EXPECT_EQ(v->toInt(), i + 1);
  }
  expect_all_released();
}

TEST_F(RRefs, ProxiesRunMethodsOnTheOwnersObject) {
  absl::StatusOr<RRef> counter =
      remote(*workers_[0], "bob", kCounter, {int64_t{5}});
  ASSERT_THAT(counter, IsOk());
  absl::StatusOr<c10::IValue> v = counter->rpc_sync().call("add", {int64_t{3}});
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->toInt(), 8);
  absl::StatusOr<c10::IValue> w =
      counter->rpc_async().call("add", {int64_t{2}}).get();
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ(w->toInt(), 10);
  absl::StatusOr<RRef> scaled =
      counter->remote().call("scale", {at::ones({2})});
  ASSERT_THAT(scaled, IsOk());
  EXPECT_EQ(scaled->owner_name(), "bob");
  absl::StatusOr<c10::IValue> s = scaled->to_here();
  ASSERT_THAT(s, IsOk());
  EXPECT_TRUE(at::equal(s->toTensor(), at::full({2}, 10.0)));
  // A third worker drives the same object through its own fork.
  absl::StatusOr<c10::IValue> from_carol = workers_[0]->rpc_sync(
      "carol", "tether_rref_test::add_via_proxy", {*counter, int64_t{1}});
  ASSERT_THAT(from_carol, IsOk());
  EXPECT_EQ(from_carol->toInt(), 11);
}

TEST_F(RRefs, RemoteAndProxyCallsUnderTheProfilerBringBackTheOwnersEvents) {
  absl::StatusOr<RRef> counter =
      remote(*workers_[0], "bob", kCounter, {int64_t{5}});
  ASSERT_THAT(counter, IsOk());
  ASSERT_THAT(counter->rpc_sync().call("add", {int64_t{0}}), IsOk());
  testing::LegacyEvents events = testing::legacy_profile([&] {
    {
      profiling::CallKey key("made");
      absl::StatusOr<RRef> sum = remote(*workers_[0], "bob", "aten::add.Tensor",
                                        {at::ones({2}), at::ones({2})});
      ASSERT_THAT(sum, IsOk());
      ASSERT_THAT(sum->get_future().get(), IsOk());  // the owner answered
    }
    {
      profiling::CallKey key("method");
      ASSERT_THAT(counter->rpc_sync().call("scale", {at::ones({3})}), IsOk());
    }
    {
      // Not a builtin: the owner runs it on its pool, under the profiler.
      profiling::CallKey key("user");
      absl::StatusOr<RRef> ones = remote(*workers_[0], "bob",
                                         "tether_rref_test::slow_ones",
                                         {int64_t{1}});
      ASSERT_THAT(ones, IsOk());
      ASSERT_THAT(ones->get_future().get(), IsOk());
    }
  });
  const auto names = ::testing::PrintToString(testing::event_names(events));
  testing::LegacyEvents add =
      testing::pushes_named(events, "made#remote_op: aten::add");
  ASSERT_EQ(add.size(), 1u) << names;
  EXPECT_EQ(add[0].nodeId(), 1);  // bob
  EXPECT_TRUE(add[0].isRemote());
  // `t * 5`: aten::mul with a Scalar, which calls aten::mul with a Tensor.
  testing::LegacyEvents mul =
      testing::pushes_named(events, "method#remote_op: aten::mul");
  ASSERT_FALSE(mul.empty()) << names;
  for (const auto& e : mul) EXPECT_EQ(e.nodeId(), 1);
  testing::LegacyEvents user =
      testing::pushes_named(events, "user#remote_op: tether_rref_test::slow_ones");
  ASSERT_EQ(user.size(), 1u) << names;
  EXPECT_EQ(user[0].nodeId(), 1);
}

TEST_F(RRefs, MissingMethodIsNotFoundNamingIt) {
  absl::StatusOr<RRef> counter =
      remote(*workers_[0], "bob", kCounter, {int64_t{0}});
  ASSERT_THAT(counter, IsOk());
  EXPECT_THAT(counter->rpc_sync().call("subtract", {int64_t{1}}),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::AllOf(HasSubstr("subtract"),
                                        HasSubstr("Counter"), HasSubstr("bob"))));
  // A plain value has no methods.
  absl::StatusOr<RRef> tensor = remote(*workers_[0], "bob", "aten::add.Tensor",
                                       {at::ones({1}), at::ones({1})});
  ASSERT_THAT(tensor, IsOk());
  EXPECT_THAT(tensor->rpc_sync().call("add", {int64_t{1}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not an object")));
}

TEST_F(RRefs, ThousandCreatedAndDroppedReleaseEverything) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 250; ++i) {
        absl::StatusOr<RRef> r =
            remote(*workers_[t % 3], (t + i) % 3, "aten::add.Tensor",
                   {at::ones({2}), at::ones({2})});
        ASSERT_THAT(r, IsOk());
        if (i % 10 == 0) {
          ASSERT_THAT(r->to_here(), IsOk());
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  expect_all_released();
}

TEST_F(RRefs, SharingAndDroppingLeaveNoForksBehind) {
  {
    absl::StatusOr<RRef> r = remote(*workers_[0], "bob", "aten::add.Tensor",
                                    {at::ones({2}), at::ones({2})});
    ASSERT_THAT(r, IsOk());
    ASSERT_THAT(workers_[0]->rpc_sync("carol", "tether_rref_test::value_of",
                                      {*r}),
                IsOk());
    ASSERT_THAT(workers_[0]->rpc_sync("bob", "tether_rref_test::value_of",
                                      {*r}),
                IsOk());
  }
  expect_all_released();
}

// A chain of eight workers, each a user that passes the RRef on as an
// argument; the last one fetches it, before the value exists (it takes
// 300 ms). Every call keeps the default timeout, ten minutes here (the
// owner waits at most 60 s for a value): once every handle is dropped, the
// owner lets go of the entry and of the value at once, not when the fetch
// could have timed out.
TEST(RRefChains, ReleasedPromptlyAfterAFetchThatWaitedWhateverTheTimeout) {
  RpcOptions options = testing::group_options("rref_test_chain", 16);
  options.default_timeout = absl::Minutes(10);
  std::vector<std::string> names;
  for (int i = 0; i < 8; ++i) names.push_back(absl::StrCat("w", i));
  std::vector<std::unique_ptr<Worker>> workers =
      testing::start_group(options, names, {rref_extension()});
  for (const auto& w : workers) ASSERT_NE(w, nullptr);
  {
    absl::StatusOr<RRef> r = remote(*workers[0], "w1",
                                    "tether_rref_test::slow_ones",
                                    {int64_t{300}});
    ASSERT_THAT(r, IsOk());
    // w0 -> w2 -> ... -> w7, each a user of w1's RRef; w7 fetches.
    std::vector<std::string> path(names.begin() + 3, names.end());
    absl::StatusOr<c10::IValue> v = workers[0]->rpc_sync(
        "w2", "tether_rref_test::forward", {*r, c10::IValue(path)});
    ASSERT_THAT(v, IsOk());
    EXPECT_TRUE(at::equal(v->toTensor(), at::ones({2})));
  }
  expect_released(workers);
  // The owner's value itself is gone too (within kBound, well before the
  // 60 s the owner would have waited for it).
  const absl::Time deadline = absl::Now() + kBound;
  while (!last_slow_storage().expired()) {
    ASSERT_LT(absl::Now(), deadline) << "w1 still holds the value";
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(testing::shutdown_group(workers), IsOk());
}

class RRefsWithLeakCheck : public RRefs {
 protected:
  RRefOptions rref_options() override {
    RRefOptions options;
    options.leak_check = true;
    return options;
  }
};

// Waits (bounded) until `w`'s owners know of at most `forks` users.
void wait_for_forks_at_most(Worker& w, int64_t forks) {
  const absl::Time deadline = absl::Now() + kBound;
  for (;;) {
    absl::StatusOr<RRefDebugInfo> info = rref_debug_info(w);
    ASSERT_THAT(info, IsOk());
    if (info->forks <= forks) return;
    ASSERT_LT(absl::Now(), deadline) << info->forks << " forks";
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// bob's function returned an RRef (owned by carol) that bob keeps as the
// value of alice's remote(); bob then begins its graceful shutdown, which
// releases the users bob's application holds. The one inside the value
// alice may still fetch must stay: carol dropped its value otherwise, and
// alice's fork of it later met an empty entry and to_here() hung (the
// peer's test_nested_rref_stress).
TEST_F(RRefs, ShutdownKeepsUsersThatOwnedValuesHold) {
  Worker& bob = *workers_[1];
  ASSERT_THAT(bob.register_function(
                  "make_rref",
                  [&bob](std::string to) {
                    absl::StatusOr<RRef> r =
                        remote(bob, to, "aten::add.Tensor",
                               {at::ones({2}), at::ones({2})});
                    if (!r.ok()) throw StatusError(r.status());
                    return *std::move(r);
                  }),
              IsOk());
  absl::StatusOr<RRef> outer =
      remote(*workers_[0], "bob", "make_rref", {std::string("carol")});
  ASSERT_THAT(outer, IsOk());
  ASSERT_THAT(outer->get_future().get(absl::Now() + kBound), IsOk());
  // A user bob's application holds: released by the shutdown.
  absl::StatusOr<RRef> app = remote(bob, "carol", "aten::add.Tensor",
                                    {at::ones({2}), at::ones({2})});
  ASSERT_THAT(app, IsOk());
  ASSERT_THAT(app->to_here(), IsOk());
  // What bob's graceful shutdown does once the group has joined.
  absl::StatusOr<std::shared_ptr<rref::ContextState>> bob_state =
      rref::context_of(&bob);
  ASSERT_THAT(bob_state, IsOk());
  (*bob_state)->release_all_users();
  // carol learns that bob let go of `app` (and, before the fix, of the
  // RRef inside alice's value too).
  ASSERT_NO_FATAL_FAILURE(wait_for_forks_at_most(*workers_[2], 1));
  absl::StatusOr<c10::IValue> fetched = outer->to_here();
  ASSERT_THAT(fetched, IsOk());
  absl::StatusOr<RRef> inner = RRef::from_ivalue(*fetched);
  ASSERT_THAT(inner, IsOk());
  absl::StatusOr<c10::IValue> value = inner->to_here(absl::Seconds(20));
  ASSERT_THAT(value, IsOk());
  EXPECT_TRUE(at::equal(value->toTensor(), at::full({2}, 2.0)));
  *inner = RRef();
  *outer = RRef();
  *app = RRef();
  EXPECT_THAT(shutdown_all(), IsOk());
}

// A release that should not happen: waits up to a second for `w` to let go
// of every RRef it owns (a wrong release shows in milliseconds), and
// returns either way.
void let_a_release_show(Worker& w) {
  const absl::Time settle = absl::Now() + absl::Seconds(1);
  while (absl::Now() < settle) {
    absl::StatusOr<RRefDebugInfo> info = rref_debug_info(w);
    ASSERT_THAT(info, IsOk());
    if (info->owners == 0) return;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// bob holds a confirmed user of carol's RRef and has just forked it to
// alice (a function's result on its way): the child is pending until carol
// confirms it. bob's graceful shutdown begins now. It must not tell carol
// that its user is gone before the child is confirmed: carol, with no other
// user, let go of the value, alice's RREF_FORK_REQUEST then made an empty
// entry and alice's to_here() waited for a value that never came (the
// peer's test_rpc_return_rref and test_pass_local_rrefs, intermittent).
TEST_F(RRefs, ShutdownKeepsAUserUntilItsChildIsConfirmed) {
  Worker& bob = *workers_[1];
  Worker& carol = *workers_[2];
  absl::StatusOr<RRef> held = remote(bob, "carol", "aten::add.Tensor",
                                     {at::ones({2}), at::ones({2})});
  ASSERT_THAT(held, IsOk());
  ASSERT_THAT(held->to_here(), IsOk());
  absl::StatusOr<std::shared_ptr<rref::ContextState>> bob_state =
      rref::context_of(&bob);
  absl::StatusOr<std::shared_ptr<rref::ContextState>> alice_state =
      rref::context_of(workers_[0].get());
  ASSERT_THAT(bob_state, IsOk());
  ASSERT_THAT(alice_state, IsOk());
  // bob forks its user (as encoding a result does); alice has not seen it.
  absl::StatusOr<wire::RRefForkData> child =
      (*bob_state)->fork(held->to_ivalue().toRRef());
  ASSERT_THAT(child, IsOk());
  (*bob_state)->release_all_users();
  // Before the fix carol hears at once that bob's user is gone and, that
  // being its only user, lets go of the value; give that a moment to show.
  ASSERT_NO_FATAL_FAILURE(let_a_release_show(carol));
  // alice receives the child: it asks carol to register it, then tells bob.
  absl::StatusOr<c10::intrusive_ptr<c10::RRefInterface>> adopted =
      (*alice_state)->adopt(*child);
  ASSERT_THAT(adopted, IsOk());
  absl::StatusOr<RRef> at_alice = RRef::from_ivalue(c10::IValue(*adopted));
  ASSERT_THAT(at_alice, IsOk());
  absl::StatusOr<c10::IValue> value = at_alice->to_here(absl::Seconds(10));
  ASSERT_THAT(value, IsOk());
  EXPECT_TRUE(at::equal(value->toTensor(), at::full({2}, 2.0)));
  // bob's user goes once alice's child is confirmed, alice's when dropped.
  *at_alice = RRef();
  adopted->reset();
  ASSERT_NO_FATAL_FAILURE(wait_for_forks_at_most(carol, 0));
  EXPECT_EQ(rref_debug_info(carol)->owners, 0);
}

// alice passes an RRef it owns to a function of bob that is still running
// when bob's graceful shutdown begins (bob was done with its own calls).
// bob's user is in use by that call: it must stay until the call ends. It
// was let go at once; alice, its only user gone, dropped its table entry,
// and the function's to_here() then met an empty entry and waited (the
// peer's test_pass_local_rrefs, intermittent).
TEST_F(RRefs, ShutdownKeepsAUserACallIsUsing) {
  Worker& alice = *workers_[0];
  Worker& bob = *workers_[1];
  auto entered = std::make_shared<absl::Notification>();
  auto go_on = std::make_shared<absl::Notification>();
  ASSERT_THAT(bob.register_function(
                  "fetch_later",
                  [entered, go_on](RRef r) {
                    entered->Notify();
                    go_on->WaitForNotificationWithTimeout(kBound);
                    absl::StatusOr<c10::IValue> v =
                        r.to_here(absl::Seconds(10));
                    if (!v.ok()) throw StatusError(v.status());
                    return v->toTensor();
                  }),
              IsOk());
  absl::StatusOr<RRef> mine = RRef::local(alice, at::full({2}, 40.0));
  ASSERT_THAT(mine, IsOk());
  Future<c10::IValue> call = alice.rpc_async("bob", "fetch_later", {*mine});
  ASSERT_TRUE(entered->WaitForNotificationWithTimeout(kBound));
  absl::StatusOr<std::shared_ptr<rref::ContextState>> bob_state =
      rref::context_of(&bob);
  ASSERT_THAT(bob_state, IsOk());
  (*bob_state)->release_all_users();
  // Before the fix alice hears at once that bob's user is gone and lets go
  // of its table entry; give that a moment to show.
  ASSERT_NO_FATAL_FAILURE(let_a_release_show(alice));
  go_on->Notify();
  absl::StatusOr<c10::IValue> value = call.get(absl::Now() + kBound);
  ASSERT_THAT(value, IsOk());
  EXPECT_TRUE(at::equal(value->toTensor(), at::full({2}, 40.0)));
  // The call is over: bob's user goes, and alice's entry with it.
  ASSERT_NO_FATAL_FAILURE(wait_for_forks_at_most(alice, 0));
}

// bob serves a call of alice that makes its own RRef (remote() to carol)
// and fetches it later; bob's graceful shutdown begins meanwhile, while
// alice and carol still work. bob's user belongs to that running call: the
// shutdown must not release it before the whole group has begun shutting
// down (the peer's barrier). It was released at once; carol, its only user
// gone, let go of the value, and the call's to_here() met an empty entry
// and waited (the peer's test_nested_remote_sparse and
// test_self_remote_rref_as_rpc_arg_sparse, intermittent).
TEST_F(RRefs, ShutdownKeepsUsersUntilTheWholeGroupShutsDown) {
  Worker& alice = *workers_[0];
  Worker& bob = *workers_[1];
  Worker& carol = *workers_[2];
  auto entered = std::make_shared<absl::Notification>();
  auto go_on = std::make_shared<absl::Notification>();
  ASSERT_THAT(bob.register_function(
                  "remote_then_fetch",
                  [&bob, entered, go_on]() {
                    absl::StatusOr<RRef> r =
                        remote(bob, "carol", "aten::add.Tensor",
                               {at::ones({2}), at::ones({2})});
                    if (!r.ok()) throw StatusError(r.status());
                    if (!r->get_future().get(absl::Now() + kBound).ok()) {
                      throw StatusError(absl::InternalError("not created"));
                    }
                    entered->Notify();
                    go_on->WaitForNotificationWithTimeout(kBound);
                    absl::StatusOr<c10::IValue> v = r->to_here(absl::Seconds(10));
                    if (!v.ok()) throw StatusError(v.status());
                    return v->toTensor();
                  }),
              IsOk());
  Future<c10::IValue> call = alice.rpc_async("bob", "remote_then_fetch", {});
  ASSERT_TRUE(entered->WaitForNotificationWithTimeout(kBound));
  std::thread bob_down([&bob] { EXPECT_THAT(bob.shutdown(), IsOk()); });
  // Before the fix carol hears at once that bob's user is gone and lets go
  // of the value; give that a moment to show.
  ASSERT_NO_FATAL_FAILURE(let_a_release_show(carol));
  EXPECT_EQ(rref_debug_info(carol)->owners, 1);
  go_on->Notify();
  absl::StatusOr<c10::IValue> value = call.get(absl::Now() + kBound);
  ASSERT_THAT(value, IsOk());
  EXPECT_TRUE(at::equal(value->toTensor(), at::full({2}, 2.0)));
  std::thread alice_down([&alice] { EXPECT_THAT(alice.shutdown(), IsOk()); });
  EXPECT_THAT(carol.shutdown(), IsOk());
  alice_down.join();
  bob_down.join();
}

TEST_F(RRefsWithLeakCheck, ShutdownReleasesHeldUsersAndFindsNoLeak) {
  absl::StatusOr<RRef> held = remote(*workers_[0], "bob", "aten::add.Tensor",
                                     {at::ones({2}), at::ones({2})});
  ASSERT_THAT(held, IsOk());
  ASSERT_THAT(held->to_here(), IsOk());
  // carol keeps a fork too, through a call that stores nothing: the owner
  // has seen several users come and go.
  ASSERT_THAT(workers_[0]->rpc_sync("carol", "tether_rref_test::value_of",
                                    {*held}),
              IsOk());
  // alice still holds `held` when the group shuts down.
  EXPECT_THAT(shutdown_all(), IsOk());
  // Using it afterwards is a clear error, not a crash.
  absl::StatusOr<c10::IValue> late = held->to_here();
  EXPECT_FALSE(late.ok());
  EXPECT_THAT(late.status().message(), HasSubstr("shut"));
}

}  // namespace
}  // namespace tether
