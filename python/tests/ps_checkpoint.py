"""A parameter server as PyTorch's RPC tutorial writes one ("Implementing a
Parameter Server Using Distributed RPC Framework"), with checkpoints:

    python3 ps_checkpoint.py STEPS LOSS_LOG [CHECKPOINT_DIR EVERY]

Rank 0 is "parameter_server", holding the model; every other rank a
trainer that runs the model's forward there through an RRef, a local head
of its own, distributed autograd and a DistributedOptimizer (SGD with
momentum) over both. Its data is drawn from torch's global generator.
Each trainer appends "<name> <step> <loss>" to LOSS_LOG at every step. With
CHECKPOINT_DIR, trainers save a checkpoint every EVERY steps with
tether.checkpoint (the parameter server its model and its share of the
optimizer; each trainer its head, its share, the generators and its data
position) and, started again, resume after the last complete one. Only the
import lines name tether.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

import tether.autograd as dist_autograd      # was: torch.distributed.autograd
import tether.checkpoint                     # the peer writes this by hand
import tether.rpc as rpc                     # was: torch.distributed.rpc
from tether.checkpoint import Checkpoint, RNGState
from tether.optim import DistributedOptimizer  # was: torch.distributed.optim
from tether.rpc import RRef


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class ParameterServer(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Net()

    def forward(self, inp):
        return self.model(inp)

    def get_param_rrefs(self):
        return [RRef(param) for param in self.model.parameters()]


param_server = None


def get_parameter_server():
    global param_server
    if param_server is None:
        param_server = ParameterServer()
    return param_server


def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def remote_method(method, rref, *args, **kwargs):
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)


class TrainerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.param_server_rref = rpc.remote("parameter_server",
                                            get_parameter_server)
        torch.manual_seed(1)
        self.head = nn.Linear(16, 4)

    def get_global_param_rrefs(self):
        remote_params = remote_method(ParameterServer.get_param_rrefs,
                                      self.param_server_rref)
        return remote_params + [RRef(p) for p in self.head.parameters()]

    def forward(self, x):
        return self.head(F.relu(remote_method(
            ParameterServer.forward, self.param_server_rref, x)))


class DataPosition:
    """Where the trainer is in its data: what a DataLoader's sampler saves."""

    def __init__(self):
        self.batches = 0

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = state["batches"]


def run_trainer(name, trainers, steps, loss_log, directory, every):
    net = TrainerNet()
    opt = DistributedOptimizer(optim.SGD, net.get_global_param_rrefs(),
                               lr=0.05, momentum=0.9)
    data = DataPosition()
    torch.manual_seed(100 + rpc.get_worker_info().id)
    start = 1
    checkpoint = None
    if directory:
        checkpoint = Checkpoint(directory, members=trainers, keep=2)
        if name == trainers[0]:
            checkpoint.add("model", net.param_server_rref)
        checkpoint.add("head", net.head)
        checkpoint.add("optimizer", opt)
        checkpoint.add("rng", RNGState())
        checkpoint.add("data", data)
        resumed = checkpoint.load()
        if resumed is not None:
            start = resumed + 1
            print("%s: resumed from the checkpoint of step %d"
                  % (name, resumed), flush=True)
    weights = torch.linspace(-1, 1, 8 * 4).reshape(8, 4)
    with open(loss_log, "a") as log:
        for step in range(start, steps + 1):
            x = torch.randn(16, 8)
            target = (x @ weights).argmax(dim=1)
            data.batches += 1
            with dist_autograd.context() as context_id:
                loss = F.cross_entropy(net(x), target)
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
            log.write("%s %d %.17g\n" % (name, step, loss.item()))
            log.flush()
            if checkpoint is not None and step % every == 0:
                saved = checkpoint.save(step)
                print("%s checkpoint: step %d, %d files, %d bytes in %.1f ms"
                      % (name, step, saved.files, saved.bytes,
                         saved.seconds * 1000), flush=True)
    assert data.batches == steps, (data.batches, steps)
    print("%s: done" % name, flush=True)


def main():
    steps, loss_log = int(sys.argv[1]), sys.argv[2]
    directory = sys.argv[3] if len(sys.argv) > 3 else None
    every = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    name = "parameter_server" if rank == 0 else "trainer%d" % rank
    print("%s: pid %d" % (name, os.getpid()), flush=True)
    if rank == 0 and directory:
        tether.checkpoint.serve(directory)
    rpc.init_rpc(name, rank=rank, world_size=world_size)
    if rank != 0:
        trainers = ["trainer%d" % r for r in range(1, world_size)]
        run_trainer(name, trainers, steps, loss_log, directory, every)
    rpc.shutdown()


if __name__ == "__main__":
    main()
