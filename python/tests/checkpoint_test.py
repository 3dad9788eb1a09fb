"""tether.checkpoint: a parameter server written as PyTorch's RPC tutorial
writes one, killed after a checkpoint and started again, resumes to the
uninterrupted run's losses; each kind of item comes back from the worker
that saved it; a step without its marker is never loaded; errors name what
is wrong."""
import collections
import os
import pickle
import signal

import pytest
import torch
import torch.nn as nn
from torch import optim

import tether.autograd as dist_autograd
import tether.rpc as rpc
from tether.checkpoint import Checkpoint, RNGState, latest
from tether.nn import RemoteModule
from tether.optim import DistributedOptimizer
import training_functions as tf
import workers

PROGRAM = os.path.join(workers.HERE, "ps_checkpoint.py")


def curve(path):
    """{step: loss} of a loss log, the last line of each step winning."""
    losses = {}
    with open(path) as f:
        for line in f:
            _, step, loss = line.split()
            losses[int(step)] = float(loss)
    return losses


def test_tutorial_parameter_server_resumes_to_the_same_losses(tmp_path):
    steps, every = 40, 10
    uninterrupted = str(tmp_path / "uninterrupted.log")
    for rc, out in workers.run_group(PROGRAM, 2, "tensorpipe",
                                     lambda rank: [str(steps), uninterrupted]):
        assert rc == 0, out
    # With checkpoints: the trainer is killed once the checkpoint of step
    # 10 is written, and the parameter server stopped, as a launcher stops
    # the others when one dies.
    log = str(tmp_path / "resumed.log")
    args = [str(steps), log, str(tmp_path / "ckpt"), str(every)]
    port = workers.free_port()
    procs = [workers.spawn([PROGRAM] + args,
                           workers.group_env(rank, 2, port, "tensorpipe"))
             for rank in range(2)]
    workers.read_until(procs[1], "trainer1 checkpoint: step 10,")
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    procs[0].terminate()
    workers.finish(procs)
    assert procs[1].returncode == -signal.SIGKILL
    # Started again with the same arguments.
    results = workers.run_group(PROGRAM, 2, "tensorpipe", lambda rank: args)
    for rc, out in results:
        assert rc == 0, out
    assert "trainer1: resumed from the checkpoint of step" in results[1][1]
    resumed = curve(log)
    assert sorted(resumed) == list(range(1, steps + 1))
    assert resumed == curve(uninterrupted)


@pytest.fixture(scope="module")
def callee():
    """This process is "caller" (rank 0); callee.py is rank 1 and allows
    training_functions."""
    with workers.with_callee("tensorpipe", ["training_functions"]) as name:
        yield name


def test_remote_modules_and_optimizers_come_back_from_their_owners(
        callee, tmp_path):
    directory = str(tmp_path / "ckpt")
    rpc.rpc_sync(callee, tf.serve_checkpoints, args=(directory,))
    module = rpc.remote(callee, tf.Model, args=(3, 2))
    remote_module = RemoteModule(callee, tf.Model, args=(3, 2))
    local = nn.Linear(2, 1)
    # LibTorch's SGD on the owners, and torch.optim's Adadelta in Python.
    sgd = DistributedOptimizer(
        optim.SGD, module.rpc_sync().parameter_rrefs()
        + [rpc.RRef(p) for p in local.parameters()], lr=0.05, momentum=0.9)
    adadelta = DistributedOptimizer(
        optim.Adadelta, remote_module.remote_parameters(), rho=0.8)
    x = torch.linspace(-1, 1, 12).reshape(4, 3)

    def step():
        with dist_autograd.context() as context_id:
            loss = ((local(module.rpc_sync().forward(x)) - 1) ** 2).mean() \
                + (remote_module(x) ** 2).mean()
            dist_autograd.backward(context_id, [loss])
            sgd.step(context_id)
            adadelta.step(context_id)
        return loss.item()

    def values():
        return (module.rpc_sync().parameter_values()
                + remote_module.get_module_rref().rpc_sync().parameter_values()
                + [p.detach().clone() for p in local.parameters()])

    checkpoint = Checkpoint(directory)
    for name, item in [("module", module), ("remote_module", remote_module),
                       ("local", local), ("sgd", sgd),
                       ("adadelta", adadelta)]:
        checkpoint.add(name, item)
    assert checkpoint.load() is None
    step()
    step()
    saved = checkpoint.save(2)
    assert saved.files == 2 and saved.bytes > 0
    assert sorted(os.listdir(saved.path)) == [
        "COMPLETE", "callee.for-caller.pt", "caller.pt"]
    losses = [step(), step()]
    after = values()
    assert checkpoint.load() == 2
    # The modules, the momentum and Adadelta's averages came back: the very
    # steps again.
    assert [step(), step()] == losses
    assert all(torch.equal(a, b) for a, b in zip(values(), after))


class Position:
    def __init__(self, batches):
        self.batches = batches

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = state["batches"]


def test_tensors_generators_and_objects_come_back(callee, tmp_path):
    directory = str(tmp_path / "ckpt")
    tensor = torch.arange(3.0)
    generator = torch.Generator().manual_seed(7)
    position = Position(5)
    checkpoint = Checkpoint(directory)
    checkpoint.add("tensor", tensor)
    checkpoint.add("generator", generator)
    checkpoint.add("rng", RNGState())
    checkpoint.add("position", position)
    checkpoint.save(1)
    drawn = torch.rand(2, generator=generator)
    drawn_global = torch.rand(2)
    tensor.fill_(0)
    position.batches = 9
    assert checkpoint.load() == 1
    assert torch.equal(tensor, torch.arange(3.0))
    assert position.batches == 5
    assert torch.equal(torch.rand(2, generator=generator), drawn)
    assert torch.equal(torch.rand(2), drawn_global)


def test_a_step_without_its_marker_is_never_loaded(callee, tmp_path):
    directory = str(tmp_path / "ckpt")
    tensor = torch.zeros(2)
    checkpoint = Checkpoint(directory, keep=2)
    checkpoint.add("w", tensor)
    for step in (1, 2, 3):
        tensor.fill_(step)
        checkpoint.save(step)
    assert sorted(os.listdir(directory)) == ["step-00000002", "step-00000003"]
    # Step 3 as a job killed while saving it leaves it; step 4 begun.
    os.unlink(os.path.join(directory, "step-00000003", "COMPLETE"))
    os.mkdir(os.path.join(directory, "step-00000004"))
    assert latest(directory) == 2
    assert checkpoint.load() == 2
    assert torch.equal(tensor, torch.full((2,), 2.0))
    assert sorted(os.listdir(directory)) == ["step-00000002"]


def test_errors_name_what_is_wrong(callee, tmp_path):
    directory = str(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="leave out caller"):
        Checkpoint(directory, members=["callee"])
    checkpoint = Checkpoint(directory)
    checkpoint.add("w", torch.zeros(2))
    with pytest.raises(ValueError, match="has an item 'w' already"):
        checkpoint.add("w", torch.zeros(2))
    with pytest.raises(TypeError, match="item 'x' is a str"):
        checkpoint.add("x", "text")
    with pytest.raises(ValueError, match="0 or more, not -1"):
        checkpoint.save(-1)
    checkpoint.save(1)
    more = Checkpoint(directory)
    more.add("w", torch.zeros(2))
    more.add("v", torch.zeros(2))
    with pytest.raises(ValueError, match="has no item 'v'"):
        more.load()
    other = Checkpoint(directory)
    other.add("w", torch.zeros(3))
    with pytest.raises(ValueError, match="item 'w': the checkpoint's tensor "
                                         r"is \[2\], this one \[3\]"):
        other.load()
    # A part holding more than states (a class torch.load's weights_only
    # would not rebuild) is refused, naming it.
    part = os.path.join(directory, "step-00000001", "caller.pt")
    before = os.path.getsize(part)
    torch.save({"w": collections.Counter()}, part)
    marker = os.path.join(directory, "step-00000001", "COMPLETE")
    with open(marker) as f:
        text = f.read().replace("caller.pt %d" % before,
                                "caller.pt %d" % os.path.getsize(part))
    with open(marker, "w") as f:
        f.write(text)
    with pytest.raises(pickle.UnpicklingError,
                       match="holds collections.Counter"):
        checkpoint.load()
    # An owner writes only in the directories it serves.
    unserved = Checkpoint(str(tmp_path / "elsewhere"))
    unserved.add("module", rpc.remote(callee, tf.Model, args=(2, 1)))
    with pytest.raises(PermissionError, match="tether.checkpoint.serve"):
        unserved.save(1)
    assert latest(str(tmp_path / "elsewhere")) is None
