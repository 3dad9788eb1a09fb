"""tether.rpc: torch.distributed.rpc's API on tether (docs/python.md).

    import tether.rpc as rpc

    rpc.init_rpc("worker0", rank=0, world_size=2)
    fut = rpc.rpc_async("worker1", torch.add, args=(torch.ones(2), 3))
    print(fut.wait())
    rpc.shutdown()

Functions travel by reference, never pickled: a torch builtin as its ATen
operator name (the callee picks the overload that fits the arguments), a
Python function or class as "module:qualname", which the callee runs only if
its policy allows it (tether.rpc._callee, docs/security.md). Arguments and
results are wire values: tensors, numbers, strings, None, lists, tuples,
dicts and RRefs; anything else is refused at the caller, naming its type.
"""
import atexit
import enum
import os
import threading
import types

import torch
from torch.jit._builtins import _find_builtin

from tether import _C
from tether.rpc import _callee
from tether.rpc._callee import allow_module, expose

__all__ = [
    "BackendType", "RpcBackendOptions", "TensorPipeRpcBackendOptions",
    "RRef", "WorkerInfo", "allow_module", "expose", "get_all_worker_infos",
    "get_rpc_timeout",
    "get_worker_info", "init_rpc", "remote", "rpc_async", "rpc_sync",
    "shutdown",
]

UNSET_RPC_TIMEOUT = -1.0
DEFAULT_RPC_TIMEOUT_SEC = 60.0

WorkerInfo = _C.WorkerInfo
RRef = _C.RRef
# RRef[T] in annotations, as the peer's `def f(rref: RRef[nn.Module])`.
RRef.__class_getitem__ = classmethod(types.GenericAlias)


class BackendType(enum.Enum):
    TENSORPIPE = "tensorpipe"
    GRPC = "grpc"
    LIBFABRIC = "libfabric"


class RpcBackendOptions:
    """Options of init_rpc, with the peer's names and defaults.

    num_worker_threads: threads that run incoming calls.
    rpc_timeout: default bound of a call, in seconds (0: none).
    init_method: where the group meets: env://, tcp://HOST:PORT, file://PATH.
    backend_settings: the backend's own settings, {"key": "value"} (e.g.
        "tensorpipe.transports": "uv", "libfabric.provider": "tcp;ofi_rxm";
        each backend's header lists its keys).
    auth_secret: the secret every worker of the group shares (default: the
        TETHER_AUTH_SECRET environment variable; none: no authentication).
    allowed_modules: modules whose functions and classes peers may call
        here, besides __main__ (docs/security.md).
    init_timeout: bound of the rendezvous, in seconds.
    _transports, _channels: the peer's TensorPipe lists, as settings.
    """

    def __init__(self, num_worker_threads=16,
                 rpc_timeout=DEFAULT_RPC_TIMEOUT_SEC, init_method="env://",
                 backend_settings=None, auth_secret=None, allowed_modules=(),
                 init_timeout=60.0, device_maps=None, devices=None,
                 _transports=None, _channels=None):
        if device_maps or devices:
            raise ValueError("device_maps and devices name CUDA devices; "
                             "tether for Python moves CPU tensors only")
        self.num_worker_threads = int(num_worker_threads)
        self.rpc_timeout = float(rpc_timeout)
        self.init_method = init_method
        self.backend_settings = dict(backend_settings or {})
        if _transports:
            self.backend_settings["tensorpipe.transports"] = ",".join(
                _transports)
        if _channels:
            self.backend_settings["tensorpipe.channels"] = ",".join(_channels)
        self.auth_secret = auth_secret
        self.allowed_modules = tuple(allowed_modules)
        self.init_timeout = float(init_timeout)


# The peer's programs name the TensorPipe options class.
TensorPipeRpcBackendOptions = RpcBackendOptions

_state_lock = threading.Lock()
_rpc_timeout = DEFAULT_RPC_TIMEOUT_SEC
_atexit_registered = False


def _backend_name(backend):
    if backend is None:
        backend = os.environ.get("TETHER_BACKEND", "tensorpipe")
    if isinstance(backend, BackendType):
        return backend.value
    if isinstance(backend, str):
        return backend.lower()
    raise TypeError("backend must be a BackendType or a name such as "
                    "'tensorpipe', 'grpc', 'libfabric'; got %r" % (backend,))


def _shutdown_at_exit():
    # A program that never called shutdown(): stop serving before the
    # interpreter goes, so no pool thread waits for a finalized GIL.
    if _C.is_initialized():
        try:
            _C.shutdown(False)
        except RuntimeError:
            pass


def init_rpc(name, backend=None, rank=-1, world_size=None,
             rpc_backend_options=None):
    """Joins the group as worker ``name``. ``rank`` -1 and ``world_size``
    None are read from the environment (RANK/WORLD_SIZE, Slurm, Open MPI).
    ``backend`` None is the TETHER_BACKEND environment variable, else
    tensorpipe."""
    global _rpc_timeout, _atexit_registered
    options = rpc_backend_options or RpcBackendOptions()
    for module in options.allowed_modules:
        allow_module(module)
    _C.init_rpc(
        name, -1 if rank is None else int(rank),
        -1 if world_size is None else int(world_size), _backend_name(backend),
        options.init_method, options.num_worker_threads, options.rpc_timeout,
        options.init_timeout, options.backend_settings,
        options.auth_secret or "", _callee.serve, _callee.Failure)
    with _state_lock:
        _rpc_timeout = options.rpc_timeout
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True


def shutdown(graceful=True):
    """Graceful: waits until every worker has called shutdown and no call
    is in flight anywhere, then stops. Otherwise stops at once."""
    _C.shutdown(bool(graceful))


def get_worker_info(worker_name=None):
    return _C.get_worker_info(worker_name)


def get_all_worker_infos():
    """Every worker of the group, by rank."""
    return _C.get_all_worker_infos()


def get_rpc_timeout():
    """The default call bound of this worker, in seconds."""
    return _rpc_timeout


_names = {}  # function -> (name, drop the keyword "inplace")


def _functional_operator(func):
    # torch.nn.functional's Python wrappers (relu, softmax ...): the ATen
    # operator of the same name, when there is one.
    if getattr(func, "__module__", None) != "torch.nn.functional":
        return None
    name = getattr(func, "__name__", "")
    try:
        torch._C._jit_get_operation("aten::" + name)
    except RuntimeError:
        return None
    return "aten::" + name


def _function_name(func):
    """The name ``func`` travels by."""
    try:
        return _names[func]
    except (KeyError, TypeError):
        pass
    if isinstance(func, str):
        return func, False
    if isinstance(func, torch.jit.ScriptFunction):
        raise TypeError("TorchScript functions cannot be called from Python "
                        "yet (docs/python.md)")
    name = _find_builtin(func)
    inplace = False
    if name is None:
        name = _functional_operator(func)
        inplace = name is not None
    if name is None:
        module = getattr(func, "__module__", None)
        qualname = getattr(func, "__qualname__", None)
        if not callable(func) or not module or not qualname:
            raise TypeError("cannot call %r remotely: tether calls functions "
                            "by reference (module and name), and this one "
                            "has none" % (func,))
        if "<locals>" in qualname or "<lambda>" in qualname:
            raise TypeError(
                "cannot call %s.%s remotely: a lambda or nested function has "
                "no name the callee can find; define it at module level"
                % (module, qualname))
        name = _callee.reference(module, qualname)
    try:
        _names[func] = (name, inplace)
    except TypeError:
        pass
    return name, inplace


def _call_parts(func, args, kwargs):
    name, functional = _function_name(func)
    kwargs = dict(kwargs) if kwargs else {}
    if functional and "inplace" in kwargs:
        if kwargs.pop("inplace"):
            raise ValueError("%s(inplace=True) cannot change a tensor of "
                             "the caller remotely" % (name,))
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = tuple(args)
    return name, args, kwargs


def rpc_sync(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs ``func(*args, **kwargs)`` on worker ``to`` and returns its
    result. ``timeout`` in seconds: -1 the default, 0 none."""
    name, args, kwargs = _call_parts(func, args, kwargs)
    return _C.rpc_sync(to, name, args, kwargs, float(timeout))


def rpc_async(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """As rpc_sync, returning a torch.futures.Future of the result."""
    name, args, kwargs = _call_parts(func, args, kwargs)
    return _C.rpc_async(to, name, args, kwargs, float(timeout))


def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs ``func`` on ``to`` and keeps the result there; returns an RRef
    at once. A failure is raised by the RRef's first use."""
    name, args, kwargs = _call_parts(func, args, kwargs)
    return _C.remote(to, name, args, kwargs, float(timeout))
