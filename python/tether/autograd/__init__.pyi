# Types of tether.autograd's public API (tether/autograd/__init__.py).
# //python:stubs_test holds them against the package with mypy's stubtest.
from types import TracebackType
from typing import Dict, Optional, Sequence, Type

import torch


def is_available() -> bool: ...


class context:
    def __enter__(self) -> int: ...
    def __exit__(self, type: Optional[Type[BaseException]],
                 value: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None: ...


def backward(context_id: int, roots: Sequence[torch.Tensor],
             retain_graph: bool = ...) -> None: ...
def get_gradients(context_id: int) -> Dict[torch.Tensor, torch.Tensor]: ...
