"""A batch-updating parameter server, as the peer's tutorial "Implementing
Batch RPC Processing Using Asynchronous Executions" writes it: trainers
fetch the model from the parameter server by value, compute gradients
locally and send them back with update_and_fetch_model, an
@rpc.functions.async_execution function whose future completes (with the
updated model) only once every trainer's gradients are in and the server
has stepped its optimizer. A small regression network stands in for the
tutorial's ResNet50.

Run (mp.spawn starts the parameter server and the trainers):
    python3 batch_ps.py
MASTER_ADDR and MASTER_PORT come from the environment when set. The only
lines that differ from the torch.distributed.rpc program are the imports
(python/tests/examples_test.py runs it both ways).
"""
import os
import threading
from datetime import datetime

import torch
import tether.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
from torch import optim

num_features = 16
num_outputs = 4
batch_size = 32
batch_update_size = 2
num_batches = 20


def timed_log(text):
    print(f"{datetime.now().strftime('%H:%M:%S')} {text}")


class BatchUpdateParameterServer(object):

    def __init__(self, batch_update_size=batch_update_size):
        torch.manual_seed(0)
        self.model = nn.Sequential(
            nn.Linear(num_features, 32),
            nn.Tanh(),
            nn.Linear(32, num_outputs),
        )
        self.lock = threading.Lock()
        self.future_model = torch.futures.Future()
        self.batch_update_size = batch_update_size
        self.curr_update_size = 0
        self.optimizer = optim.SGD(self.model.parameters(), lr=0.02,
                                   momentum=0.9)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def get_model(self):
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref, grads):
        self = ps_rref.local_value()
        with self.lock:
            for p, g in zip(self.model.parameters(), grads):
                p.grad += g
            self.curr_update_size += 1
            fut = self.future_model

            if self.curr_update_size >= self.batch_update_size:
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                fut.set_result(self.model)
                timed_log("PS updated model")
                self.future_model = torch.futures.Future()

        return fut


class Trainer(object):

    def __init__(self, ps_rref):
        self.ps_rref = ps_rref
        self.loss_fn = nn.MSELoss()
        # every trainer sees its own data of the same linear target
        self.rank = rpc.get_worker_info().id
        self.generator = torch.Generator().manual_seed(self.rank)
        self.target_weight = torch.randn(
            num_features, num_outputs,
            generator=torch.Generator().manual_seed(1234))

    def get_next_batch(self):
        for _ in range(num_batches):
            inputs = torch.randn(batch_size, num_features,
                                 generator=self.generator)
            labels = inputs @ self.target_weight
            yield inputs, labels

    def train(self):
        name = rpc.get_worker_info().name
        m = self.ps_rref.rpc_sync().get_model()
        losses = []
        for inputs, labels in self.get_next_batch():
            loss = self.loss_fn(m(inputs), labels)
            loss.backward()
            losses.append(loss.item())
            timed_log(f"{name} reporting grads, loss {losses[-1]:.6f}")
            m = rpc.rpc_sync(
                self.ps_rref.owner(),
                BatchUpdateParameterServer.update_and_fetch_model,
                args=(self.ps_rref, [p.grad for p in m.parameters()]),
            )
        print(f"{name} first loss {losses[0]:.6f} final loss "
              f"{losses[-1]:.6f}")


def run_trainer(ps_rref):
    trainer = Trainer(ps_rref)
    trainer.train()


def run_ps(trainers):
    timed_log("Start training")
    ps_rref = rpc.RRef(BatchUpdateParameterServer())
    futs = []
    for trainer in trainers:
        futs.append(
            rpc.rpc_async(trainer, run_trainer, args=(ps_rref,))
        )

    torch.futures.wait_all(futs)
    timed_log("Finish training")


def run(rank, world_size):
    os.environ.setdefault('MASTER_ADDR', 'localhost')
    os.environ.setdefault('MASTER_PORT', '29500')
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=16,
        rpc_timeout=0  # infinite timeout
    )
    if rank != 0:
        rpc.init_rpc(
            f"trainer{rank}",
            rank=rank,
            world_size=world_size,
            rpc_backend_options=options
        )
        # trainer passively waiting for ps to kick off training iterations
    else:
        rpc.init_rpc(
            "ps",
            rank=rank,
            world_size=world_size,
            rpc_backend_options=options
        )
        run_ps([f"trainer{r}" for r in range(1, world_size)])

    # block until all rpcs finish
    rpc.shutdown()


if __name__ == "__main__":
    world_size = batch_update_size + 1
    mp.spawn(run, args=(world_size, ), nprocs=world_size, join=True)
