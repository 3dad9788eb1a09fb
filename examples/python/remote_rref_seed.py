"""The peer's second seed program: remote + to_here, and a local RRef
shared with another worker.

Run one process per rank with MASTER_ADDR, MASTER_PORT set:
    python3 remote_rref_seed.py 0 & python3 remote_rref_seed.py 1
The only lines that differ from the torch.distributed.rpc program are the
imports (python/tests/seeds_test.py runs it both ways). The backend is
TETHER_BACKEND's (default tensorpipe).
"""
import sys

import torch
import tether.rpc as rpc
from tether.rpc import RRef


def f(rref):
    return rref.to_here() + 1


def twice_local(rref):
    return rref.local_value() * 2


def run_worker(rank, world_size):
    if rank == 0:
        rpc.init_rpc("worker0", rank=rank, world_size=world_size)
        # remote + to_here: the values stay on worker1 until fetched.
        rref1 = rpc.remote("worker1", torch.add, args=(torch.ones(2), 3))
        rref2 = rpc.remote("worker1", torch.add, args=(torch.ones(2), 1))
        x = rref1.to_here() + rref2.to_here()
        print("to_here sum:", x)
        assert torch.equal(x, torch.tensor([6.0, 6.0]))
        # The owner of rref1 reads it with local_value().
        doubled = rpc.rpc_sync("worker1", twice_local, args=(rref1,))
        print("local_value on the owner:", doubled)
        assert torch.equal(doubled, torch.tensor([8.0, 8.0]))
        # A local RRef, shared with worker1, which fetches it.
        rref = RRef(torch.zeros(2, 2))
        shared = rpc.rpc_sync("worker1", f, args=(rref,))
        print("shared local RRef:", shared)
        assert torch.equal(shared, torch.ones(2, 2))
        assert rref.is_owner() and not rref1.is_owner()
        print("owners:", rref.owner().name, rref1.owner().name)
    else:
        rpc.init_rpc("worker%d" % rank, rank=rank, world_size=world_size)
    rpc.shutdown()


if __name__ == "__main__":
    run_worker(int(sys.argv[1]), 2)
