"""The peer's third seed program: a model split across two workers, each
part an nn.Module created there with rpc.remote and driven through RRef
proxies, trained by the master with distributed autograd and a
DistributedOptimizer.

Run one process per rank with MASTER_ADDR, MASTER_PORT set:
    python3 split_model_seed.py 0 & python3 split_model_seed.py 1 &
    python3 split_model_seed.py 2
The only lines that differ from the torch.distributed.rpc program are the
imports (python/tests/seeds_test.py runs it both ways). The backend is
TETHER_BACKEND's (default tensorpipe).
"""
import sys

import torch
import torch.nn as nn
from torch import optim
import tether.autograd as dist_autograd
import tether.rpc as rpc
from tether.optim import DistributedOptimizer
from tether.rpc import RRef


class Stage(nn.Module):
    """One part of the model; it lives on the worker that created it."""

    def __init__(self, in_features, out_features, activation):
        super().__init__()
        torch.manual_seed(in_features)
        self.linear = nn.Linear(in_features, out_features)
        self.activation = activation

    def forward(self, x):
        y = self.linear(x)
        return torch.relu(y) if self.activation else y

    def parameter_rrefs(self):
        return [RRef(p) for p in self.parameters()]


class SplitModel(nn.Module):
    """On the master: stage1 lives on worker1, stage2 on worker2."""

    def __init__(self):
        super().__init__()
        self.stage1 = rpc.remote("worker1", Stage, args=(4, 16, True))
        self.stage2 = rpc.remote("worker2", Stage, args=(16, 1, False))

    def forward(self, x):
        h = self.stage1.rpc_sync().forward(x)
        return self.stage2.rpc_sync().forward(h)

    def parameter_rrefs(self):
        return (self.stage1.rpc_sync().parameter_rrefs()
                + self.stage2.rpc_sync().parameter_rrefs())


def train(steps):
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    model = SplitModel()
    dist_optim = DistributedOptimizer(optim.SGD, model.parameter_rrefs(),
                                      lr=0.05)
    losses = []
    for step in range(steps):
        with dist_autograd.context() as context_id:
            loss = nn.functional.mse_loss(model(x), y)
            dist_autograd.backward(context_id, [loss])
            dist_optim.step(context_id)
        losses.append(loss.item())
        print("step %d loss %.4f" % (step, losses[-1]))
    print("loss fell from %.4f to %.4f" % (losses[0], losses[-1]))
    assert losses[-1] < losses[0] / 2, losses


def run_worker(rank, world_size):
    if rank == 0:
        rpc.init_rpc("master", rank=rank, world_size=world_size)
        train(30)
    else:
        rpc.init_rpc("worker%d" % rank, rank=rank, world_size=world_size)
    rpc.shutdown()


if __name__ == "__main__":
    run_worker(int(sys.argv[1]), 3)
