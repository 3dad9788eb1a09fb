"""A parameter server that survives losing a trainer: the tutorial's
parameter server ("Implementing a Parameter Server Using Distributed RPC
Framework"), with checkpoints and a dynamic group that a restarted trainer
rejoins while the others train on. The peer cannot do this: its dynamic
groups take no distributed autograd, and torchrun restarts every worker.

Run it under tether's launcher, which restarts a failed trainer alone:
    tether_run --nproc 3 --max_restarts 2 --elastic -- \\
        python3 elastic_ps.py --steps 200 --checkpoint_dir ckpt
Rank 0 is the parameter server, the other ranks trainers. Each trainer
saves, every --checkpoint_every steps and with tether.checkpoint, its own
head, its share of the optimizer (written by the parameter server), its
random generators and its data position, alone, in CHECKPOINT_DIR/<name>.
Killed, it is started again (tether_run sets TETHER_REJOIN=1), joins the
group under its old name, loads its last checkpoint and trains on with the
parameters the server holds now. trainer1 also saves the server's model in
CHECKPOINT_DIR/parameter_server, which it loads only when the whole job
starts again (tether_run restarts every worker when the server is lost: it
owns the shared state). With --loss_log, each trainer appends
"<name> <step> <loss>" at every step.
"""
import argparse
import os
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

import tether.autograd as dist_autograd
import tether.checkpoint
import tether.rpc as rpc
from tether.checkpoint import Checkpoint, RNGState
from tether.optim import DistributedOptimizer
from tether.rpc import RRef

NUM_FEATURES = 8
NUM_CLASSES = 4


# --------- The parameter server --------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(NUM_FEATURES, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class ParameterServer(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Net()

    def forward(self, inp):
        # Other trainers step the parameters in place while this trainer's
        # backward pass still needs them: autograd keeps copies.
        with torch.autograd.graph.saved_tensors_hooks(torch.clone,
                                                      lambda t: t):
            return self.model(inp)

    def get_param_rrefs(self):
        return [RRef(param) for param in self.model.parameters()]


param_server = None
server_lock = threading.Lock()
finished = set()
finished_changed = threading.Condition()


def get_parameter_server():
    global param_server
    with server_lock:
        if param_server is None:
            param_server = ParameterServer()
        return param_server


def trainer_done(rank):
    """A trainer has trained its last step. A dynamic group has no barrier
    at shutdown (each worker leaves on its own), so the parameter server
    waits for this from every trainer instead."""
    with finished_changed:
        finished.add(rank)
        finished_changed.notify_all()


def run_parameter_server(world_size):
    print("parameter_server: serving %d trainer(s)" % (world_size - 1),
          flush=True)
    with finished_changed:
        finished_changed.wait_for(lambda: len(finished) == world_size - 1)
    print("parameter_server: every trainer is done", flush=True)


# --------- Trainers --------------------

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
        self.head = nn.Linear(16, NUM_CLASSES)

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


def wait_for(name, seconds=60):
    """In a dynamic group a trainer may join before the parameter server."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return rpc.get_worker_info(name)
        except Exception as e:  # not (yet) in the group
            if time.monotonic() > deadline:
                raise RuntimeError("worker %r did not join within %d s: %s"
                                   % (name, seconds, e))
            time.sleep(0.02)


def run_trainer(name, rank, args):
    wait_for("parameter_server")
    rejoin = os.environ.get("TETHER_REJOIN") == "1"
    net = TrainerNet()
    opt = DistributedOptimizer(optim.SGD, net.get_global_param_rrefs(),
                               lr=0.05, momentum=0.9)
    data = DataPosition()
    torch.manual_seed(100 + rank)
    start = 1
    own = server = None
    if args.checkpoint_dir:
        # Alone: this trainer saves and loads without the others.
        own = Checkpoint(os.path.join(args.checkpoint_dir, name),
                         members=[name], keep=2)
        own.add("head", net.head)
        own.add("optimizer", opt)
        own.add("rng", RNGState())
        own.add("data", data)
        if rank == 1:
            server = Checkpoint(
                os.path.join(args.checkpoint_dir, "parameter_server"),
                members=[name], keep=2)
            server.add("model", net.param_server_rref)
            if not rejoin:  # the whole job starts (again)
                server.load()
        resumed = own.load()
        if resumed is not None:
            start = resumed + 1
            print("%s: %s from the checkpoint of step %d"
                  % (name, "rejoined, resumed" if rejoin else "resumed",
                     resumed), flush=True)
    weights = torch.linspace(-1, 1, NUM_FEATURES * NUM_CLASSES).reshape(
        NUM_FEATURES, NUM_CLASSES)
    log = open(args.loss_log, "a") if args.loss_log else None
    for step in range(start, args.steps + 1):
        x = torch.randn(16, NUM_FEATURES)
        target = (x @ weights).argmax(dim=1)
        data.batches += 1
        with dist_autograd.context() as context_id:
            loss = F.cross_entropy(net(x), target)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        if log is not None:
            log.write("%s %d %.17g %.6f\n" % (name, step, loss.item(),
                                              time.time()))
            log.flush()
        if step % 20 == 0 or step == args.steps:
            print("%s: step %d, loss %.4f" % (name, step, loss.item()),
                  flush=True)
        if own is not None and (step % args.checkpoint_every == 0
                                or step == args.steps):
            own.save(step)
            if server is not None:
                server.save(step)
    assert data.batches == args.steps, (data.batches, args.steps)
    rpc.rpc_sync("parameter_server", trainer_done, args=(rank,))
    print("%s: done" % name, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint_dir", default=None)
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--loss_log", default=None)
    args = parser.parse_args()
    # tether_run (or torchrun) says which process this is.
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    name = "parameter_server" if rank == 0 else "trainer%d" % rank
    print("%s: rank %d of %d, pid %d" % (name, rank, world_size, os.getpid()),
          flush=True)
    if rank == 0 and args.checkpoint_dir:
        # The server writes each trainer's share of the optimizer, and its
        # model for trainer1, into their directories.
        for whose in ["parameter_server"] + [
                "trainer%d" % r for r in range(1, world_size)]:
            tether.checkpoint.serve(os.path.join(args.checkpoint_dir, whose))
    # world_size=0: a dynamic group, which workers join and leave as it runs.
    rpc.init_rpc(name, rank=rank, world_size=0)
    if rank == 0:
        run_parameter_server(world_size)
    else:
        run_trainer(name, rank, args)
    rpc.shutdown()


if __name__ == "__main__":
    main()
