"""What the Python benches on the RPC API share: tools/peer_bench.py and
tools/py_bench.py, on torch.distributed.rpc and tether.rpc alike.

CpuUse: CPU time of both ends of a two-process RPC benchmark (the C++
bench's counterpart is CpuUse in tools/internal/workloads.h). CPU is user +
system time of every thread of a process (time.process_time(),
CLOCK_PROCESS_CPUTIME_ID); the callee's is read in the callee by one
rpc_sync of cpu_seconds, a function of this module that both ends import by
name. Also: a free port for the rendezvous, a percentile of samples, and
the distributed autograd step both benches time.
"""
import socket
import time


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(samples, q):
    """The q-quantile (0 to 1) of `samples`, one of them (no interpolation)."""
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(q * len(samples)))]


def autograd_step(dist_autograd, linear, x):
    """One distributed autograd step: in a context, the forward of the
    module `linear` (an RRef on the callee) on `x` through its proxy,
    backward of the sum, the gradients; the context's exit."""
    with dist_autograd.context() as context_id:
        y = linear.rpc_sync().forward(x)
        dist_autograd.backward(context_id, [y.sum()])
        grads = dist_autograd.get_gradients(context_id)
    assert grads[x].shape == x.shape


def cpu_seconds():
    """CPU time of this process, user and system, all its threads."""
    return time.process_time()


class CpuUse:
    """CPU of this process and of `to` over a stretch: start() before,
    seconds() after. Each asks `to` by one call, which stays outside the
    stretch here and at its edge on the other side."""

    def __init__(self, rpc, to):
        self.rpc, self.to = rpc, to
        self.mine = self.theirs = 0.0

    def start(self):
        self.theirs = self.rpc.rpc_sync(self.to, cpu_seconds)
        self.mine = cpu_seconds()

    def seconds(self):
        """(this process's, `to`'s) CPU seconds since start()."""
        mine = cpu_seconds() - self.mine
        return mine, self.rpc.rpc_sync(self.to, cpu_seconds) - self.theirs

    def per_call_us(self, calls):
        """Both ends' CPU since start(), per call, in microseconds."""
        return sum(self.seconds()) / calls * 1e6

    def idle_percent(self, seconds):
        """Each end's CPU, in % of a core, over `seconds` of no calls."""
        self.start()
        time.sleep(seconds)
        return tuple(100 * used / seconds for used in self.seconds())
