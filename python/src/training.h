// The training half of tether._C: distributed autograd contexts, backward
// and gradients (tether.autograd) and the DistributedOptimizer
// (tether.optim), over the C++ layers autograd/ and optim/.
//
// Threads and the GIL: backward, a context's release and an optimizer's
// creation and step wait on other workers, so they release the GIL.
#ifndef TETHER_PYTHON_SRC_TRAINING_H_
#define TETHER_PYTHON_SRC_TRAINING_H_

#include <pybind11/pybind11.h>

namespace tether::python {

// Adds AutogradContext, autograd_* functions and DistributedOptimizer.
void bind_training(pybind11::module_& m);

}  // namespace tether::python

#endif  // TETHER_PYTHON_SRC_TRAINING_H_
