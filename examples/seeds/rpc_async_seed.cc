// The peer's first seed program (examples/python/rpc_async_seed.py) in C++:
// a master calls torch.add, min and a user function on a worker with
// rpc_async. Run: tether_run --nproc 2 -- rpc_async_seed (the backend is
// TETHER_BACKEND's, default tensorpipe).
#include <ATen/ATen.h>

#include <iostream>

#include "tether/tether.h"

at::Tensor my_add(const at::Tensor& t1, const at::Tensor& t2) {
  return at::add(t1, t2);
}

absl::Status run_worker(int rank) {
  TETHER_RETURN_IF_ERROR(tether::register_function("my_add", my_add));
  if (rank == 0) {
    TETHER_RETURN_IF_ERROR(tether::init_rpc("master"));
    auto fut1 = tether::rpc_async("worker1", "aten::add", {at::ones({2}), 3});
    auto fut2 = tether::rpc_async("worker1", "min", {1, 2});
    auto fut3 = tether::rpc_async("worker1", "my_add",
                                  {at::ones({2}), at::ones({2})});
    TETHER_ASSIGN_OR_RETURN(c10::IValue sum, fut1.get());
    TETHER_ASSIGN_OR_RETURN(c10::IValue min, fut2.get());
    TETHER_ASSIGN_OR_RETURN(c10::IValue added, fut3.get());
    at::Tensor result = sum.toTensor() + min.toInt();
    std::cout << "torch.add + min: " << result << "\n"
              << "my_add: " << added.toTensor() << std::endl;
    if (!at::equal(result, at::full({2}, 5.0)) ||
        !at::equal(added.toTensor(), at::full({2}, 2.0))) {
      return absl::InternalError("wrong results");
    }
  } else {
    TETHER_RETURN_IF_ERROR(tether::init_rpc(absl::StrCat("worker", rank)));
  }
  return tether::shutdown();
}

int main() { return tether::run_main(run_worker); }
