"""cpu_use: CPU time of both ends of a two-process RPC benchmark.

Imported by tools/peer_bench.py and tools/py_bench.py (torch.distributed.rpc
and tether.rpc alike); the C++ bench's counterpart is CpuUse in
tools/internal/workloads.h. CPU is user + system time of every thread of a
process (time.process_time(), CLOCK_PROCESS_CPUTIME_ID); the callee's is
read in the callee by one rpc_sync of cpu_seconds, a function of this
module that both ends import by name.
"""
import time


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
