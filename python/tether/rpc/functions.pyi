# Types of tether.rpc.functions' public API (tether/rpc/functions.py).
from typing import Any, Callable, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def async_execution(fn: _F) -> _F: ...
