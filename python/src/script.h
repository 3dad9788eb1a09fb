// TorchScript functions that take or read RRefs, for tether._C.
//
// A `@torch.jit.script` function compiles `r.to_here()` and
// `r.local_value()` of an `RRef[T]` to operators of the peer's
// libtorch_python, which cast the RRef to the peer's classes, and
// torch's own call path (ScriptFunction.__call__) takes only the peer's RRef
// objects for an RRef[T] argument. So the callee runs such a function
// through here: a copy of its graph, its calls inlined and those nodes
// pointed at tether's operators (a graph rewrite the RRef layer registers: rewrite_graph,
// core/callables.h), on arguments
// converted by torch (tether's RRefs by tether), with the GIL released while
// it runs.
//
// Threads and the GIL: both functions need the GIL; call_script releases
// it while the function runs.
#ifndef TETHER_PYTHON_SRC_SCRIPT_H_
#define TETHER_PYTHON_SRC_SCRIPT_H_

#include <pybind11/pybind11.h>

namespace tether::python {

// Adds script_reads_rrefs(fn) and call_script(fn, args, kwargs).
void bind_script(pybind11::module_& m);

}  // namespace tether::python

#endif  // TETHER_PYTHON_SRC_SCRIPT_H_
