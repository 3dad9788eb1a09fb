"""Functions the Python tests call remotely (a module callee.py allows)."""
import collections
import time
from typing import List, Tuple

import torch
import tether.rpc as rpc


def add(a, b):
    return a + b


def echo(value):
    return value


def fail(message):
    raise ValueError(message)


def slow(seconds):
    time.sleep(seconds)  # a slow function, for timeouts
    return seconds


def all_gather(value):
    """The callee's side of the peer's rpc.api._all_gather (surface_test)."""
    return rpc._all_gather(value)


def whoami():
    return rpc.get_worker_info().name


def add_on(to, a, b):
    """A nested call: this worker asks `to` to add."""
    return rpc.rpc_sync(to, torch.add, args=(a, b))


def python_add_on(to, a, b):
    """A nested call of a Python function (the caller serves it)."""
    return rpc.rpc_sync(to, add, args=(a, b))


def apply(fn, *args):
    """Calls a function that arrived as an argument value."""
    return fn(*args)


def call_method(method, rref, *args):
    """The peer's `_call_method`: a method of a class, by reference, on the
    object an RRef holds here."""
    return method(rref.local_value(), *args)


def fetch_twice(rref):
    return rref.to_here() * 2


class Accumulator:
    """A Python object kept on its owner by remote()."""

    @classmethod
    def start_at(cls, start):
        return cls(start).total

    def __init__(self, start):
        self.total = start

    def add(self, x):
        self.total += x
        return self.total


def total_of(rref):
    return rref.local_value().total


@torch.jit.script
def script_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A TorchScript function; callers name it, the callee runs its own."""
    return a + b


@torch.jit.script
def script_read_rref(r: rpc.RRef[torch.Tensor],
                     t: torch.Tensor) -> torch.Tensor:
    """TorchScript reading an RRef (tether's RRef operators run it)."""
    return r.to_here() + t


@torch.jit.script
def script_local_value(r: rpc.RRef[torch.Tensor]) -> torch.Tensor:
    return r.local_value() * 2


@torch.jit.script
def script_about_rref(r: rpc.RRef[torch.Tensor]) -> Tuple[str, bool, bool]:
    return r.owner_name(), r.is_owner(), r.confirmed_by_owner()


@torch.jit.script
def script_read_twice(r: rpc.RRef[torch.Tensor]) -> torch.Tensor:
    """Calls another scripted function that reads the RRef too."""
    return script_read_rref(r, r.to_here(0.0)) * 2


@torch.jit.script
def script_read_all(rs: List[rpc.RRef[torch.Tensor]]) -> torch.Tensor:
    total = torch.zeros(3)
    for r in rs:
        total = total + r.to_here()
    return total


@torch.jit.script
def script_rref_back(r: rpc.RRef[torch.Tensor]) -> rpc.RRef[torch.Tensor]:
    return r


@rpc.functions.async_execution
def async_add(to, a, b):
    """Returns a future; its caller gets the future's value."""
    return rpc.rpc_async(to, torch.add, args=(a, b))


@rpc.functions.async_execution
def async_not_a_future():
    return 1


def add_through_proxy(rref, x):
    """A callee's proxy call back to the RRef's owner."""
    return rref.rpc_sync().add(x)


class Point:
    """A user's object, sent and returned by value (pickled)."""

    def __init__(self, x, y, t):
        self.x, self.y, self.t = x, y, t

    def shifted(self, dx):
        return Point(self.x + dx, self.y, self.t * 2)


def shift(point, dx):
    return point.shifted(dx)


def fetch_held(point):
    """The value of the RRef a Point holds as its t."""
    return point.t.to_here()


def make_linear(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2)


def make_counter():
    import collections
    return collections.Counter("aab")


Pair = collections.namedtuple("Pair", "a b")
