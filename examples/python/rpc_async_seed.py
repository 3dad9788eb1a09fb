"""The peer's first seed program: a master calls torch.add, min and a user
function on a worker with rpc_async.

Run one process per rank with MASTER_ADDR, MASTER_PORT set:
    python3 rpc_async_seed.py 0 & python3 rpc_async_seed.py 1
The only line that differs from the torch.distributed.rpc program is the
import (python/tests/rpc_test.py runs it both ways). The backend is
TETHER_BACKEND's (default tensorpipe).
"""
import sys

import torch
import tether.rpc as rpc


def my_add(t1, t2):
    return torch.add(t1, t2)


def run_worker(rank, world_size):
    if rank == 0:
        rpc.init_rpc("master", rank=rank, world_size=world_size)
        fut1 = rpc.rpc_async("worker1", torch.add, args=(torch.ones(2), 3))
        fut2 = rpc.rpc_async("worker1", min, args=(1, 2))
        fut3 = rpc.rpc_async("worker1", my_add,
                             args=(torch.ones(2), torch.ones(2)))
        result = fut1.wait() + fut2.wait()
        print("torch.add + min:", result)
        print("my_add:", fut3.wait())
        assert torch.equal(result, torch.tensor([5.0, 5.0]))
        assert torch.equal(fut3.wait(), torch.tensor([2.0, 2.0]))
    else:
        rpc.init_rpc("worker%d" % rank, rank=rank, world_size=world_size)
    rpc.shutdown()


if __name__ == "__main__":
    run_worker(int(sys.argv[1]), 2)
