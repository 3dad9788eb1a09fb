# Types of tether.optim's public API (tether/optim/__init__.py).
# //python:stubs_test holds them against the package with mypy's stubtest.
from typing import Any, Iterable, Type

import torch

from tether.rpc import RRef


class DistributedOptimizer:
    optimizer_class: Type[torch.optim.Optimizer]

    def __init__(self, optimizer_class: Type[torch.optim.Optimizer],
                 params_rref: Iterable[RRef[torch.Tensor]], *args: Any,
                 **kwargs: Any) -> None: ...
    def step(self, context_id: int) -> None: ...
