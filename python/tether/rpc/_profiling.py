"""Calls under the profiler, as the peer's (torch/distributed/rpc/api.py).

Inside ``torch.autograd.profiler_legacy.profile()`` (or
``torch.autograd.profiler.profile(use_kineto=False)``), each rpc_sync,
rpc_async and remote is an event of the caller's profile named by
``_build_rpc_profiling_key`` ("rpc_async#fn(caller -> callee)"), lasting
until its answer comes, and the callee's events come back into the same
profile as remote events named ``<key>#remote_op: <event>`` with the
callee's rank as their node (tether's core does that part:
core/profiling.h). The kineto profiler (torch.profiler.profile) is not
carried, as in the peer.
"""
import enum
import itertools

import torch
import torch.autograd.profiler_legacy
import torch.autograd.profiler_util

from tether import _C

_LEGACY = torch._C._profiler.ActiveProfilerType.LEGACY


class RPCExecMode(enum.Enum):
    """The peer's kinds of call, which name profiled calls."""
    SYNC = "sync"
    ASYNC = "async"
    ASYNC_JIT = "async_jit"
    REMOTE = "remote"


def _build_rpc_profiling_key(exec_type, func_name, current_worker_name,
                             dst_worker_name):
    """The name of a call's event in the caller's profile, as the peer's."""
    return "rpc_%s#%s(%s -> %s)" % (exec_type.value, func_name,
                                    current_worker_name, dst_worker_name)


def enabled():
    """Whether this thread runs the legacy profiler."""
    return (torch.autograd._profiler_enabled()
            and torch._C._autograd._profiler_type() == _LEGACY)


def function_name(func, name):
    """What names ``func`` in a key, as in the peer's: a TorchScript
    function's qualified name, an operator's name, or a Python function's
    __qualname__."""
    if isinstance(func, torch.jit.ScriptFunction):
        return torch._jit_internal._qualified_name(func)
    if not name.startswith("py::"):
        return name
    return getattr(func, "__qualname__", name)


def record(exec_type, func, name, caller, callee):
    """The record_function of one call, to enter around it, and its key."""
    key = _build_rpc_profiling_key(exec_type, function_name(func, name),
                                   caller, callee)
    return torch.autograd.profiler.record_function(key), key


class _server_process_global_profile(torch.autograd.profiler_legacy.profile):
    """The peer's rpc._server_process_global_profile: while on, every
    request that runs user code which this process serves (from any peer,
    on any thread) is profiled, with this profile's settings
    (record_shapes, profile_memory ...). On exit, ``function_events`` holds
    them all and ``process_global_function_events`` one list per request.
    Profiles may nest: each sees the requests served while it is on."""

    def __enter__(self):
        if not self.enabled:
            return self
        if self.entered:
            raise RuntimeError("autograd profiler traces are not reentrant")
        self.entered = True
        self._server_profile = _C.server_profile_start(
            self.record_shapes, self.profile_memory, self.with_stack,
            self.with_flops, self.with_modules)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if not self.enabled:
            return False
        gathered = _C.server_profile_stop(self._server_profile)
        process_global_events = []
        for request_events in gathered:
            events = torch.autograd.profiler_legacy._parse_legacy_records(
                [request_events])
            events.sort(key=lambda e: [e.time_range.start, -e.time_range.end])
            process_global_events.append(events)
        self.function_events = torch.autograd.profiler_util.EventList(
            list(itertools.chain(*process_global_events)),
            use_cuda=self.use_cuda, profile_memory=self.profile_memory)
        self.function_events._build_tree()
        self.process_global_function_events = process_global_events
        return False
