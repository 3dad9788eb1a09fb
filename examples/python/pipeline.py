"""Distributed pipeline parallelism, as the peer's tutorial "Distributed
Pipeline Parallelism Using RPC" writes it: the model is split into two
shards on two workers; the master splits each batch into micro-batches,
sends each through the shards as RRefs with rpc_async, so that shard 1
works on one micro-batch while shard 2 works on the one before, gathers
the outputs with torch.futures.wait_all and torch.cat, and trains both
shards with distributed autograd and a DistributedOptimizer. Small
multilayer perceptrons stand in for the tutorial's ResNet50 shards.

Run (mp.spawn starts the three ranks):
    python3 pipeline.py
MASTER_ADDR and MASTER_PORT come from the environment when set. The only
lines that differ from the torch.distributed.rpc program are the imports
(python/tests/examples_test.py runs it both ways).
"""
import os
import threading

import torch
import torch.nn as nn
import tether.autograd as dist_autograd
import tether.rpc as rpc
import torch.multiprocessing as mp
import torch.optim as optim
from tether.optim import DistributedOptimizer
from tether.rpc import RRef

num_features = 32
hidden_features = 64
num_classes = 10


#########################################################
#           Define Model Parallel Shards                #
#########################################################

class ShardBase(nn.Module):
    def __init__(self):
        super(ShardBase, self).__init__()
        self._lock = threading.Lock()

    def parameter_rrefs(self):
        return [RRef(p) for p in self.parameters()]


class Shard1(ShardBase):
    """
    The first part of the model: two hidden layers.
    """
    def __init__(self, device):
        super(Shard1, self).__init__()
        torch.manual_seed(1)
        self.device = device
        self.seq = nn.Sequential(
            nn.Linear(num_features, hidden_features),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_features, hidden_features),
            nn.ReLU(inplace=True),
        ).to(self.device)

    def forward(self, x_rref):
        x = x_rref.to_here().to(self.device)
        with self._lock:
            out = self.seq(x)
        return out.cpu()


class Shard2(ShardBase):
    """
    The second part of the model: the classifier head.
    """
    def __init__(self, device):
        super(Shard2, self).__init__()
        torch.manual_seed(2)
        self.device = device
        self.seq = nn.Sequential(
            nn.Linear(hidden_features, hidden_features),
            nn.ReLU(inplace=True),
        ).to(self.device)
        self.fc = nn.Linear(hidden_features, num_classes).to(self.device)

    def forward(self, x_rref):
        x = x_rref.to_here().to(self.device)
        with self._lock:
            out = self.fc(self.seq(x))
        return out.cpu()


class DistNet(nn.Module):
    """
    Assemble two parts as an nn.Module and define pipelining logic
    """
    def __init__(self, split_size, workers):
        super(DistNet, self).__init__()

        self.split_size = split_size

        # Put the first part of the model on workers[0]
        self.p1_rref = rpc.remote(workers[0], Shard1, args=("cpu",))

        # Put the second part of the model on workers[1]
        self.p2_rref = rpc.remote(workers[1], Shard2, args=("cpu",))

    def forward(self, xs):
        # Split the input batch xs into micro-batches, and collect async RPC
        # futures into a list
        out_futures = []
        for x in iter(xs.split(self.split_size, dim=0)):
            x_rref = RRef(x)
            y_rref = self.p1_rref.remote().forward(x_rref)
            z_fut = self.p2_rref.rpc_async().forward(y_rref)
            out_futures.append(z_fut)

        # collect and cat all output tensors into one tensor.
        return torch.cat(torch.futures.wait_all(out_futures))

    def parameter_rrefs(self):
        remote_params = []
        remote_params.extend(self.p1_rref.remote().parameter_rrefs().to_here())
        remote_params.extend(self.p2_rref.remote().parameter_rrefs().to_here())
        return remote_params


#########################################################
#                   Run RPC Processes                   #
#########################################################

num_epochs = 10
num_batches = 4
batch_size = 64


def run_master(split_size):

    # put the two model parts on worker1 and worker2 respectively
    model = DistNet(split_size, ["worker1", "worker2"])
    loss_fn = nn.MSELoss()
    opt = DistributedOptimizer(
        optim.SGD,
        model.parameter_rrefs(),
        lr=2.0,
        momentum=0.9,
    )

    # a fixed random teacher labels the inputs
    torch.manual_seed(0)
    teacher = torch.randn(num_features, num_classes)
    batches = []
    for i in range(num_batches):
        inputs = torch.randn(batch_size, num_features)
        one_hot_indices = (inputs @ teacher).argmax(dim=1).view(batch_size, 1)
        labels = torch.zeros(batch_size, num_classes) \
                      .scatter_(1, one_hot_indices, 1)
        batches.append((inputs, labels))

    losses = []
    for epoch in range(num_epochs):
        epoch_loss = 0.0
        for inputs, labels in batches:
            # The distributed autograd context is the dedicated scope for the
            # distributed backward pass to store gradients, which can later
            # be retrieved using the context_id by the distributed optimizer.
            with dist_autograd.context() as context_id:
                outputs = model(inputs)
                loss = loss_fn(outputs, labels)
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
            epoch_loss += loss.item()
        losses.append(epoch_loss / num_batches)
        print(f"epoch {epoch} loss {losses[-1]:.6f}")
    print(f"first loss {losses[0]:.6f} final loss {losses[-1]:.6f}")


def run_worker(rank, world_size, split_size):
    os.environ.setdefault('MASTER_ADDR', 'localhost')
    os.environ.setdefault('MASTER_PORT', '29500')

    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16,
                                              rpc_timeout=300)

    if rank == 0:
        rpc.init_rpc(
            "master",
            rank=rank,
            world_size=world_size,
            rpc_backend_options=options
        )
        run_master(split_size)
    else:
        rpc.init_rpc(
            f"worker{rank}",
            rank=rank,
            world_size=world_size,
            rpc_backend_options=options
        )
        pass

    # block until all rpcs finish
    rpc.shutdown()


if __name__ == "__main__":
    world_size = 3
    # micro-batches of 16 rows: 4 of them in each batch of 64
    split_size = 16
    mp.spawn(run_worker, args=(world_size, split_size), nprocs=world_size,
             join=True)
