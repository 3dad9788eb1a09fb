"""tether.optim: torch.distributed.optim's DistributedOptimizer on tether
(docs/python.md).

    from tether.optim import DistributedOptimizer   # was: torch.distributed.optim

    with dist_autograd.context() as context_id:
        loss = model(x).sum()
        dist_autograd.backward(context_id, [loss])
        dist_optim = DistributedOptimizer(optim.SGD, param_rrefs, lr=0.05)
        dist_optim.step(context_id)

Each owner of parameters builds the optimizer over its own tensors and
steps it with the gradients the context accumulated there. For
torch.optim's SGD, Adam, AdamW, Adagrad and RMSprop it runs LibTorch's own
optimizer of the same kind (C++ optim/, no Python on the step path), with
their arguments, defaults included. Any other class (Adadelta, Rprop, a
user's torch.optim.Optimizer subclass), or one of those five with an
argument LibTorch's optimizers do not have (maximize=True, ...), travels by
reference, as a called function does, and the owner builds it in Python
as the peer's _LocalOptimizer does, if its policy allows the class:
torch.optim's optimizer classes always, a user's class when the owner
allows its module (docs/security.md); else the constructor raises the
owner's refusal, naming the class and how to allow it.
"""
import inspect
import threading

import torch
from torch.optim.optimizer import required

from tether import _C
from tether import autograd, rpc

__all__ = ["DistributedOptimizer"]

# torch.optim class -> (tether kind, the class's arguments tether passes on).
_KINDS = {
    torch.optim.SGD: ("SGD", ("lr", "momentum", "dampening", "weight_decay",
                              "nesterov")),
    torch.optim.Adam: ("Adam", ("lr", "betas", "eps", "weight_decay",
                                "amsgrad")),
    torch.optim.AdamW: ("AdamW", ("lr", "betas", "eps", "weight_decay",
                                  "amsgrad")),
    torch.optim.Adagrad: ("Adagrad", ("lr", "lr_decay", "weight_decay",
                                      "initial_accumulator_value", "eps")),
    torch.optim.RMSprop: ("RMSprop", ("lr", "alpha", "eps", "weight_decay",
                                      "momentum", "centered")),
}


def _options(optimizer_class, args, kwargs):
    """The tether options of ``optimizer_class(params, *args, **kwargs)``,
    every default of the torch.optim class included, as (kind, options);
    options is None when an argument LibTorch's optimizer of that kind
    lacks is not its default (the owners then run the torch.optim class in
    Python)."""
    kind, passed = _KINDS[optimizer_class]
    signature = inspect.signature(optimizer_class)
    bound = signature.bind(None, *args, **kwargs)  # TypeError as torch.optim's
    given = dict(bound.arguments)
    given.pop("params")
    for name, value in given.items():
        default = signature.parameters[name].default
        if name not in passed and value != default:
            return kind, None
    bound.apply_defaults()
    options = {}
    for name in passed:
        value = bound.arguments[name]
        if value is required:
            raise ValueError("%s needs the argument '%s'"
                             % (optimizer_class.__name__, name))
        if name == "betas":
            beta1, beta2 = value
            options["beta1"], options["beta2"] = float(beta1), float(beta2)
        elif isinstance(value, bool):
            options[name] = value
        elif isinstance(value, torch.Tensor):
            options[name] = float(value.item())
        else:
            options[name] = float(value)
    return kind, options


class _LocalOptimizer:
    """On an owner: ``optimizer_class`` over the tensors of this worker's
    ``param_rrefs``, as the peer's _LocalOptimizer. Built by remote(), so
    the owner keeps it while the DistributedOptimizer's RRef lives."""

    # Steps on one owner run one at a time, whichever optimizer asks: two
    # trainers' optimizers over the same parameters must not interleave
    # (the C++ kinds have their own lock, as the peer's two kinds do).
    _lock = threading.Lock()

    def __init__(self, optimizer_class, param_rrefs, *args, **kwargs):
        params = []
        for i, rref in enumerate(param_rrefs):
            value = rref.local_value()
            if not isinstance(value, torch.Tensor):
                raise TypeError("parameter %d holds a %s, not a tensor"
                                % (i, type(value).__qualname__))
            params.append(value)
        self.params = params
        self.optimizer = optimizer_class(params, *args, **kwargs)

    def step(self, context_id):
        """Steps with the gradients ``context_id`` holds here, set as the
        parameters' ``.grad`` for the step only (a parameter without one is
        skipped; the ``.grad`` a user set is put back)."""
        grads = autograd.get_gradients(context_id)
        with _LocalOptimizer._lock:
            saved = [p.grad for p in self.params]
            try:
                for p in self.params:
                    p.grad = grads.get(p)
                self.optimizer.step()
            finally:
                for p, grad in zip(self.params, saved):
                    p.grad = grad

    def state_dict(self):
        """The optimizer's state, for tether.checkpoint (taken between
        steps)."""
        with _LocalOptimizer._lock:
            return self.optimizer.state_dict()

    def load_state_dict(self, state):
        with _LocalOptimizer._lock:
            self.optimizer.load_state_dict(state)


def _local_optimizer_step(optimizer_rref, context_id):
    optimizer_rref.local_value().step(context_id)


def _wait_all(futures):
    """Waits for every future; raises the first error once all are done."""
    first = None
    for fut in futures:
        try:
            fut.wait()
        except Exception as e:
            if first is None:
                first = e
    if first is not None:
        raise first


class DistributedOptimizer:
    """Steps the parameters behind ``params_rref`` (RRefs of tensors, on any
    workers) with ``optimizer_class`` (a torch.optim.Optimizer class the
    owners allow) built with ``*args, **kwargs`` on each owner.

    The constructor waits until every owner has built its optimizer; a
    failure there (an RRef that holds no tensor, a class the owner refuses,
    the class's own error) names the worker.
    """

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        if not inspect.isclass(optimizer_class):
            raise TypeError("optimizer_class must be a class, got %r"
                            % (optimizer_class,))
        params = list(params_rref)
        for i, rref in enumerate(params):
            if not isinstance(rref, _C.RRef):
                raise TypeError("params_rref[%d] is a %s, not an RRef of a "
                                "parameter" % (i, type(rref).__qualname__))
        self.optimizer_class = optimizer_class
        self._optimizer = None
        self._remote_optimizers = []
        if optimizer_class in _KINDS:
            kind, options = _options(optimizer_class, args, kwargs)
            if options is not None:
                self._optimizer = _C.DistributedOptimizer(kind, params,
                                                          options)
                return
        by_owner = {}  # owner's name -> its RRefs, in order of first use
        for rref in params:
            by_owner.setdefault(rref.owner().name, []).append(rref)
        self._remote_optimizers = [
            rpc.remote(owner, _LocalOptimizer,
                       args=(optimizer_class, rrefs) + tuple(args),
                       kwargs=kwargs)
            for owner, rrefs in by_owner.items()]
        _wait_all([rref._get_future()
                   for rref in self._remote_optimizers])

    def _local_optimizers(self):
        """RRefs to the optimizer each owner runs, which answer
        state_dict() and load_state_dict(state) there (tether.checkpoint
        has each owner save its own)."""
        if self._optimizer is not None:
            return list(self._optimizer.local_optimizers)
        return list(self._remote_optimizers)

    def step(self, context_id):
        """Every owner steps, at once, with the gradients ``context_id``
        holds there; returns when all are done (raising the first error)."""
        if not isinstance(context_id, int) or isinstance(context_id, bool):
            raise TypeError("context_id must be an int, got %r"
                            % (context_id,))
        if self._optimizer is not None:
            self._optimizer.step(context_id)
            return
        _wait_all([rpc.rpc_async(rref.owner(), _local_optimizer_step,
                                 args=(rref, context_id))
                   for rref in self._remote_optimizers])
