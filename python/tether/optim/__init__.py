"""tether.optim: torch.distributed.optim's DistributedOptimizer on tether
(docs/python.md).

    from tether.optim import DistributedOptimizer   # was: torch.distributed.optim

    with dist_autograd.context() as context_id:
        loss = model(x).sum()
        dist_autograd.backward(context_id, [loss])
        dist_optim = DistributedOptimizer(optim.SGD, param_rrefs, lr=0.05)
        dist_optim.step(context_id)

Each owner of parameters runs LibTorch's own optimizer of the same kind
over its tensors (C++ optim/, no Python on the step path), with the
gradients the context accumulated there. The kinds are torch.optim's SGD,
Adam, AdamW, Adagrad and RMSprop with their arguments, defaults included;
an argument LibTorch's optimizers do not have (maximize=True, foreach,
...) is a ValueError unless it keeps its default.
"""
import inspect

import torch
from torch.optim.optimizer import required

from tether import _C

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
    every default of the torch.optim class included."""
    kind, passed = _KINDS[optimizer_class]
    signature = inspect.signature(optimizer_class)
    bound = signature.bind(None, *args, **kwargs)  # TypeError as torch.optim's
    given = dict(bound.arguments)
    given.pop("params")
    for name, value in given.items():
        default = signature.parameters[name].default
        if name not in passed and value != default:
            raise ValueError(
                "%s(%s=%r): tether's DistributedOptimizer runs LibTorch's %s, "
                "which has no '%s'; it takes %s" % (
                    optimizer_class.__name__, name, value, kind, name,
                    ", ".join(passed)))
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


class DistributedOptimizer:
    """Steps the parameters behind ``params_rref`` (RRefs of tensors, on any
    workers) with ``optimizer_class`` (one of torch.optim's SGD, Adam, AdamW,
    Adagrad, RMSprop) built with ``*args, **kwargs`` on each owner.

    The constructor waits until every owner has built its optimizer; a
    failure there (an RRef that holds no tensor) names the worker.
    """

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        if optimizer_class not in _KINDS:
            raise ValueError(
                "tether's DistributedOptimizer supports torch.optim.SGD, "
                "Adam, AdamW, Adagrad and RMSprop, not %r"
                % (getattr(optimizer_class, "__qualname__", optimizer_class),))
        params = list(params_rref)
        for i, rref in enumerate(params):
            if not isinstance(rref, _C.RRef):
                raise TypeError("params_rref[%d] is a %s, not an RRef of a "
                                "parameter" % (i, type(rref).__qualname__))
        kind, options = _options(optimizer_class, args, kwargs)
        self.optimizer_class = optimizer_class
        self._optimizer = _C.DistributedOptimizer(kind, params, options)

    def step(self, context_id):
        """Every owner steps, at once, with the gradients ``context_id``
        holds there; returns when all are done (raising the first error)."""
        if not isinstance(context_id, int) or isinstance(context_id, bool):
            raise TypeError("context_id must be an int, got %r"
                            % (context_id,))
        self._optimizer.step(context_id)
