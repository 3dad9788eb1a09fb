#include "rref/rref_testing.h"

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <thread>
#include <utility>
#include <vector>

#include "core/rpc.h"
#include "testing/loopback_group.h"

namespace tether::testing {
namespace {

RRef rref_of(const c10::IValue& v) {
  absl::StatusOr<RRef> r = RRef::from_ivalue(v);
  TORCH_CHECK(r.ok(), r.status().ToString());
  return *r;
}

at::Tensor value_of(const c10::IValue& r) {
  absl::StatusOr<c10::IValue> v = rref_of(r).to_here(kRRefOpTimeout);
  TORCH_CHECK(v.ok(), v.status().ToString());
  return v->toTensor();
}

bool is_confirmed(const c10::IValue& r) {
  return rref_of(r).confirmed_by_owner();
}

at::Tensor forward(const c10::IValue& r, std::vector<std::string> path) {
  if (path.empty()) return value_of(r);
  std::string next = path.front();
  path.erase(path.begin());
  absl::StatusOr<c10::IValue> v =
      rpc_sync(next, kForward, {r, c10::IValue(path)}, {}, kRRefOpTimeout);
  TORCH_CHECK(v.ok(), v.status().ToString());
  return v->toTensor();
}

at::Tensor forward_default(const c10::IValue& r,
                           std::vector<std::string> path) {
  if (path.empty()) {
    absl::StatusOr<c10::IValue> v = rref_of(r).to_here();
    TORCH_CHECK(v.ok(), v.status().ToString());
    return v->toTensor();
  }
  std::string next = path.front();
  path.erase(path.begin());
  absl::StatusOr<c10::IValue> v =
      rpc_sync(next, kForwardDefault, {r, c10::IValue(path)});
  TORCH_CHECK(v.ok(), v.status().ToString());
  return v->toTensor();
}

c10::IValue make_local(const at::Tensor& t) {
  absl::StatusOr<RRef> r = RRef::local(t * 10);
  TORCH_CHECK(r.ok(), r.status().ToString());
  return r->to_ivalue();
}

c10::IValue remote_add(const std::string& owner, const at::Tensor& x) {
  absl::StatusOr<RRef> r = remote(owner, "aten::add.Tensor",
                                  {x, at::ones_like(x)}, {}, kRRefOpTimeout);
  TORCH_CHECK(r.ok(), r.status().ToString());
  return r->to_ivalue();
}

at::Tensor sum_all(const c10::IValue& rrefs) {
  TORCH_CHECK(rrefs.isList(), "sum_all: expected a list of RRefs");
  at::Tensor total;
  for (const c10::IValue& r : rrefs.toListRef()) {
    at::Tensor v = value_of(r);
    total = total.defined() ? total + v : v;
  }
  TORCH_CHECK(total.defined(), "sum_all: no RRefs");
  return total;
}

std::vector<int64_t> debug_counts() {
  Worker* worker = current_worker();
  TORCH_CHECK(worker != nullptr, "debug_counts: no worker");
  absl::StatusOr<RRefDebugInfo> info = rref_debug_info(*worker);
  TORCH_CHECK(info.ok(), info.status().ToString());
  return {info->owners, info->forks, info->pending_users,
          info->pending_children};
}

TORCH_LIBRARY(tether_rref_testing, m) {
  m.def("value_of(Any r) -> Tensor", &value_of);
  m.def("is_confirmed(Any r) -> bool", &is_confirmed);
  m.def("forward(Any r, str[] path) -> Tensor", &forward);
  m.def("forward_default(Any r, str[] path) -> Tensor", &forward_default);
  m.def("make_local(Tensor t) -> Any", &make_local);
  m.def("remote_add(str owner, Tensor x) -> Any", &remote_add);
  m.def("sum_all(Any rrefs) -> Tensor", &sum_all);
  m.def("debug_counts() -> int[]", &debug_counts);
}

}  // namespace

std::vector<std::unique_ptr<Worker>> start_workers(
    const BackendRegistry& registry, const RpcOptions& options,
    const std::vector<std::string>& names, const RRefOptions& rref_options,
    const std::vector<ExtensionFactory>& more) {
  std::vector<ExtensionFactory> extensions = {rref_extension(rref_options)};
  extensions.insert(extensions.end(), more.begin(), more.end());
  return start_group(registry, options, names, extensions);
}

void shutdown_workers(std::vector<std::unique_ptr<Worker>>& workers) {
  absl::Status stopped = shutdown_group(workers);
  EXPECT_TRUE(stopped.ok()) << stopped;
}

absl::StatusOr<RRefDebugInfo> remote_debug_info(Worker& from,
                                                const std::string& worker) {
  absl::StatusOr<c10::IValue> counts =
      from.rpc_sync(worker, kDebugCounts, {}, {}, kRRefOpTimeout);
  if (!counts.ok()) return counts.status();
  std::vector<int64_t> c = counts->toIntVector();
  if (c.size() != 4) {
    return absl::InternalError(
        absl::StrCat("debug_counts() returned ", c.size(), " counts, not 4"));
  }
  RRefDebugInfo info;
  info.owners = c[0];
  info.forks = c[1];
  info.pending_users = c[2];
  info.pending_children = c[3];
  return info;
}

bool all_released(const RRefDebugInfo& info) {
  return info.owners == 0 && info.forks == 0 && info.pending_users == 0 &&
         info.pending_children == 0;
}

void expect_released_by(
    absl::string_view who,
    const std::function<absl::StatusOr<RRefDebugInfo>()>& read,
    absl::Time deadline) {
  for (;;) {
    absl::StatusOr<RRefDebugInfo> info = read();
    ASSERT_TRUE(info.ok()) << who << ": " << info.status();
    if (all_released(*info)) return;
    ASSERT_LT(absl::Now(), deadline)
        << who << " still has " << info->owners << " owners, " << info->forks
        << " forks, " << info->pending_users << " pending users, "
        << info->pending_children << " pending children";
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace tether::testing
