// Distributed backward from the value an RRef holds: the autograd layer's
// side of RRefs (the peer's RRef.backward(context_id)). It lives here, not
// in rref/, because the arrows between layers point down: autograd uses
// rref, rref knows nothing of autograd.
//
// The owner runs the pass: locally when the calling worker owns the RRef,
// otherwise by a call of the operator tether::rref_backward on the owner
// (this target registers it, so a program whose workers may own RRefs that
// others run backward from links it; //tether and the Python module do).
#ifndef TETHER_AUTOGRAD_RREF_BACKWARD_H_
#define TETHER_AUTOGRAD_RREF_BACKWARD_H_

#include <absl/status/status.h>

#include <cstdint>

#include "rref/rref.h"

namespace tether::autograd {

// Runs distributed autograd's backward of context `context_id` (see
// autograd/autograd.h) from `rref`'s value, a scalar tensor that requires
// grad, on its owner: locally there, or by a call to the owner. Errors as
// autograd::backward, plus those of the call; INVALID_ARGUMENT naming the
// RRef when its value is not a tensor; FAILED_PRECONDITION once the RRef's
// worker is shut down.
[[nodiscard]] absl::Status backward(const RRef& rref, int64_t context_id,
                                    bool retain_graph = false);

}  // namespace tether::autograd

#endif  // TETHER_AUTOGRAD_RREF_BACKWARD_H_
