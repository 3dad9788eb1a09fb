// The peer's second seed program (examples/python/remote_rref_seed.py) in
// C++: remote + to_here, and a local RRef shared with another worker.
// Run: tether_run --nproc 2 -- remote_rref_seed (the backend is
// TETHER_BACKEND's, default tensorpipe).
#include <ATen/ATen.h>

#include <iostream>

#include "tether/tether.h"

using tether::RRef;

absl::StatusOr<at::Tensor> f(const RRef& rref) {
  TETHER_ASSIGN_OR_RETURN(at::Tensor value, rref.to_here<at::Tensor>());
  return value + 1;
}

absl::StatusOr<at::Tensor> twice_local(const RRef& rref) {
  TETHER_ASSIGN_OR_RETURN(at::Tensor value, rref.local_value<at::Tensor>());
  return value * 2;
}

absl::Status run_worker(int rank) {
  TETHER_RETURN_IF_ERROR(tether::register_function("f", f));
  TETHER_RETURN_IF_ERROR(tether::register_function("twice_local", twice_local));
  if (rank == 0) {
    TETHER_RETURN_IF_ERROR(tether::init_rpc("worker0"));
    // remote + to_here: the values stay on worker1 until fetched.
    TETHER_ASSIGN_OR_RETURN(RRef rref1, tether::remote("worker1", "aten::add",
                                                       {at::ones({2}), 3}));
    TETHER_ASSIGN_OR_RETURN(RRef rref2, tether::remote("worker1", "aten::add",
                                                       {at::ones({2}), 1}));
    TETHER_ASSIGN_OR_RETURN(at::Tensor x1, rref1.to_here<at::Tensor>());
    TETHER_ASSIGN_OR_RETURN(at::Tensor x2, rref2.to_here<at::Tensor>());
    std::cout << "to_here sum: " << x1 + x2 << std::endl;
    // The owner of rref1 reads it with local_value().
    TETHER_ASSIGN_OR_RETURN(at::Tensor doubled, tether::rpc_sync<at::Tensor>(
                                                    "worker1", "twice_local", {rref1}));
    std::cout << "local_value on the owner: " << doubled << std::endl;
    // A local RRef, shared with worker1, which fetches it.
    TETHER_ASSIGN_OR_RETURN(RRef rref, RRef::local(at::zeros({2, 2})));
    TETHER_ASSIGN_OR_RETURN(at::Tensor shared, tether::rpc_sync<at::Tensor>(
                                                   "worker1", "f", {rref}));
    std::cout << "shared local RRef: " << shared << std::endl;
    std::cout << "owners: " << rref.owner_name() << " " << rref1.owner_name()
              << std::endl;
    if (!at::equal(x1 + x2, at::full({2}, 6.0)) ||
        !at::equal(doubled, at::full({2}, 8.0)) ||
        !at::equal(shared, at::ones({2, 2})) || !rref.is_owner() ||
        rref1.is_owner()) {
      return absl::InternalError("wrong results");
    }
  } else {
    TETHER_RETURN_IF_ERROR(tether::init_rpc(absl::StrCat("worker", rank)));
  }
  return tether::shutdown();
}

int main() { return tether::run_main(run_worker); }
