"""tether.rpc.functions: torch.distributed.rpc.functions' decorator.

    @rpc.functions.async_execution
    def async_add(to, x, y):
        return rpc.rpc_async(to, torch.add, args=(x, y))

A function so decorated returns a torch.futures.Future; its caller gets the
future's value, not the future. The callee holds one of its pool threads
until the future completes (with the GIL released), so a chain of such calls
deeper than the pool's threads (num_worker_threads) waits for a thread.
"""
import functools

import torch

__all__ = ["async_execution"]

# The peer's mark, which its programs may test for.
MARK = "_wrapped_async_rpc_function"


def async_execution(fn):
    """Marks ``fn`` as returning a future whose value is the call's result.
    Goes under ``@staticmethod`` / ``@classmethod``, as in the peer."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    setattr(wrapper, MARK, fn)
    return wrapper


def is_async(fn):
    return getattr(fn, MARK, None) is not None


def result_of(fn, result):
    """What a call of ``fn`` that returned ``result`` answers with: for an
    async_execution function, the value of the future it returned."""
    if not is_async(fn):
        return result
    # torch.futures.Future derives from torch._C.Future, which is what
    # rpc_async returns.
    if not isinstance(result, torch._C.Future):
        raise RuntimeError(
            "Functions decorated with @rpc.async_function must return a "
            "torch.futures.Future object, but got %s" % type(result).__name__)
    return result.wait()  # releases the GIL while it waits
