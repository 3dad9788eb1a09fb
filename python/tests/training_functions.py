"""Functions and classes the training tests call remotely (a module
callee.py allows)."""
import torch
import torch.nn as nn

import tether.autograd as dist_autograd
import tether.rpc as rpc


def mul_add(a, b):
    """A Python function between tensors: its graph runs on the callee."""
    return a * b + a


def scalar_sum(t):
    return (t * 3).sum()


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        # Fixed weights, not a seeded draw: an owner builds several models
        # at once on its pool, and torch's global generator is shared, so a
        # seed set here could be followed by another thread's draws.
        with torch.no_grad():
            count = in_features * out_features
            self.linear.weight.copy_(torch.linspace(-0.5, 0.5, count).reshape(
                out_features, in_features))
            self.linear.bias.fill_(0.1)

    def forward(self, x):
        return self.linear(x)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def parameter_values(self):
        return [p.detach().clone() for p in self.parameters()]

    def _private(self):
        return "private"


def gradients_here(module_rref, context_id):
    """The gradients `context_id` holds for the module's parameters on its
    owner (this worker), in parameters() order (None where it has none)."""
    grads = dist_autograd.get_gradients(context_id)
    return [grads.get(p) for p in module_rref.local_value().parameters()]


def grads_are_not_in_dot_grad(module_rref):
    return all(p.grad is None for p in module_rref.local_value().parameters())


class SignSGD(torch.optim.Optimizer):
    """A user's optimizer class (the owner allows this module): the
    DistributedOptimizer builds it on the owner in Python."""

    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


class FailingStep(SignSGD):
    def step(self, closure=None):
        raise ValueError("no step today")


def train_through(remote_module, x, lr):
    """On a worker a RemoteModule was sent to: forward through it, backward
    with distributed autograd and a step of its remote parameters; returns
    its output after the step."""
    from tether.optim import DistributedOptimizer
    dist_opt = DistributedOptimizer(torch.optim.SGD,
                                    remote_module.remote_parameters(), lr=lr)
    with dist_autograd.context() as context_id:
        dist_autograd.backward(context_id, [remote_module(x).sum()])
        dist_opt.step(context_id)
    return remote_module(x)


def serve_checkpoints(directory):
    """Lets a caller's checkpoints in `directory` write and read this
    worker's parts (a program calls tether.checkpoint.serve itself)."""
    import tether.checkpoint
    tether.checkpoint.serve(directory)
