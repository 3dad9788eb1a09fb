"""Two trainers of a DistributedDataParallel module, each running backward
with distributed autograd: `ddp_grads.py RANK` (MASTER_ADDR, MASTER_PORT,
GLOO_PORT set). Prints, on rank 0, whether each trainer's context holds
the average of the two trainers' local gradients, as the peer's
DDP + RPC gives it."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import tether.autograd as dist_autograd
import tether.rpc as rpc


def local_grads(rank):
    """What plain autograd gives rank `rank`'s input, without DDP."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x = torch.full((4, 3), float(rank + 1))
    model(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def check(rank):
    torch.manual_seed(0)
    model = DDP(nn.Linear(3, 2))
    x = torch.full((4, 3), float(rank + 1))
    with dist_autograd.context() as context_id:
        dist_autograd.backward(context_id, [model(x).pow(2).sum()])
        grads = dist_autograd.get_gradients(context_id)
        mine = [grads[p] for p in model.parameters()]
    average = [(a + b) / 2 for a, b in zip(local_grads(0), local_grads(1))]
    same = all(torch.allclose(m, a) for m, a in zip(mine, average))
    untouched = all(p.grad is None for p in model.parameters())
    return same, untouched


if __name__ == "__main__":
    rank = int(sys.argv[1])
    dist.init_process_group(
        "gloo", init_method="tcp://127.0.0.1:%s" % os.environ["GLOO_PORT"],
        rank=rank, world_size=2)
    rpc.init_rpc("trainer%d" % rank, rank=rank, world_size=2)
    same, untouched = check(rank)
    print("rank %d: context holds the average: %s; .grad untouched: %s"
          % (rank, same, untouched), flush=True)
    rpc.shutdown()
    dist.destroy_process_group()
