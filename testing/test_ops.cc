#include "testing/test_ops.h"

#include <ATen/ATen.h>
#include <absl/synchronization/notification.h>
#include <torch/library.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/rpc.h"

namespace tether::testing {
namespace {

at::Tensor scale(const at::Tensor& x, double factor) { return x * factor; }

at::Tensor fail(const at::Tensor& x) {
  TORCH_CHECK(false, "fail was asked to fail on a tensor of ", x.numel(),
              " elements");
}

int64_t slow(int64_t millis) {
  std::this_thread::sleep_for(std::chrono::milliseconds(millis));
  return millis;
}

at::Tensor add_via(const std::string& to, const at::Tensor& a,
                   const at::Tensor& b) {
  absl::StatusOr<c10::IValue> sum = rpc_sync(to, "aten::add.Tensor", {a, b});
  TORCH_CHECK(sum.ok(), "onward call failed: ", sum.status().ToString());
  return sum->toTensor();
}

at::Tensor slow_then_add_via(const std::string& to) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return add_via(to, at::ones({2}), at::ones({2}));
}

std::string whoami() {
  absl::StatusOr<WorkerInfo> me = get_current_worker_info();
  TORCH_CHECK(me.ok(), me.status().ToString());
  return me->name;
}

at::Tensor identity(const at::Tensor& x) { return x; }

int64_t nesting(const c10::IValue& x) {
  int64_t depth = 0;
  for (c10::IValue v = x; v.isList() && !v.toListRef().empty();
       v = v.toListRef()[0]) {
    ++depth;
  }
  return depth;
}

int64_t chain(int64_t hops) {
  if (hops <= 0) return 0;
  Worker* worker = current_worker();
  TORCH_CHECK(worker != nullptr, "chain: no worker");
  const int world = static_cast<int>(worker->get_all_worker_infos().size());
  const int next = (worker->get_current_worker_info().id + 1) % world;
  Future<c10::IValue> onward = worker->rpc_async(next, kChain, {hops - 1});
  (void)onward;  // not awaited on purpose
  return hops;
}

absl::Notification& released() {
  static auto* notification = new absl::Notification;
  return *notification;
}

int64_t release() {
  released().Notify();
  return 0;
}

TORCH_LIBRARY(tether_test, m) {
  m.def("scale(Tensor x, float factor) -> Tensor", &scale);
  m.def("fail(Tensor x) -> Tensor", &fail);
  m.def("slow(int millis) -> int", &slow);
  m.def("add_via(str to, Tensor a, Tensor b) -> Tensor", &add_via);
  m.def("slow_then_add_via(str to) -> Tensor", &slow_then_add_via);
  m.def("whoami() -> str", &whoami);
  m.def("identity(Tensor x) -> Tensor", &identity);
  m.def("nesting(Any x) -> int", &nesting);
  m.def("chain(int hops) -> int", &chain);
  m.def("release() -> int", &release);
}

}  // namespace

bool wait_for_release(absl::Duration timeout) {
  return released().WaitForNotificationWithTimeout(timeout);
}

c10::IValue nested_lists(int depth) {
  c10::IValue value = c10::IValue(std::vector<int64_t>{1});
  for (int i = 1; i < depth; ++i) {
    c10::impl::GenericList outer(c10::AnyType::get());
    outer.push_back(value);
    value = outer;
  }
  return value;
}

}  // namespace tether::testing
