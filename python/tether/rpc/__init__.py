"""tether.rpc: torch.distributed.rpc's API on tether (docs/python.md).

    import tether.rpc as rpc

    rpc.init_rpc("worker0", rank=0, world_size=2)
    fut = rpc.rpc_async("worker1", torch.add, args=(torch.ones(2), 3))
    print(fut.wait())
    rpc.shutdown()

Functions travel by reference, never pickled: a torch builtin as its ATen
operator name (the callee picks the overload that fits the arguments), a
Python function or class as "module:qualname", which the callee runs only if
its policy allows it (tether.rpc._callee, docs/security.md). Tensors,
numbers, strings, None, lists, tuples, dicts and RRefs travel as wire
values; any other argument or result travels pickled and is unpickled by
the receiver under its own policy (tether.rpc._pickle; ``add_safe_globals``
allows more, as torch.serialization's does for torch.load).
"""
import atexit
import contextlib
import copy
import enum
import inspect
import os
import threading
import types

import torch
from torch.jit._builtins import _find_builtin

from tether import _C
from tether.rpc import _callee, _errors, _profiling, functions
from tether.rpc._callee import allow_module, expose
from tether.rpc._pickle import (add_safe_globals, clear_safe_globals,
                                get_safe_globals)
from tether.rpc._profiling import (RPCExecMode, _build_rpc_profiling_key,
                                   _server_process_global_profile)

__all__ = [
    "BackendType", "RpcBackendOptions", "TensorPipeRpcBackendOptions",
    "RRef", "RpcTimeoutError", "WorkerInfo", "add_safe_globals",
    "allow_module", "clear_safe_globals", "expose", "get_safe_globals",
    "enable_gil_profiling", "get_all_worker_infos", "get_current_worker_info",
    "get_rpc_timeout",
    "functions", "get_worker_info", "init_rpc", "remote", "rpc_async", "rpc_sync",
    "shutdown",
]

UNSET_RPC_TIMEOUT = -1.0
DEFAULT_RPC_TIMEOUT_SEC = 60.0
# shutdown(timeout=): no bound, as the peer's default.
DEFAULT_SHUTDOWN_TIMEOUT = 0.0

RpcTimeoutError = _errors.RpcTimeoutError

WorkerInfo = _C.WorkerInfo
# A WorkerInfo sent by value is rebuilt from its name and id
# (tether.rpc._pickle allows the class as a reconstructor).
WorkerInfo.__reduce__ = lambda self: (WorkerInfo, (self.name, self.id))
# Paddle's name for the id.
WorkerInfo.rank = property(lambda self: self.id, doc="the worker's rank")
_endpoints = {}  # (name, rank) -> (ip, port) or None, read once per group


def _endpoint(info):
    key = (info.name, info.id)
    if key not in _endpoints:
        _endpoints[key] = _C.endpoint_of(info)
    return _endpoints[key]


# Paddle's: where the worker listens, from the address its backend
# published in the group's store (None where it has no ip and port: the
# libfabric backend). Read on first use while the group is up.
WorkerInfo.ip = property(lambda self: (_endpoint(self) or (None, None))[0],
                         doc="the ip address the worker listens on, or None")
WorkerInfo.port = property(lambda self: (_endpoint(self) or (None, None))[1],
                           doc="the port the worker listens on, or None")
RRef = _C.RRef


def _rref_reduce(self):
    # An RRef travels only in tether's messages (forked by the RRef layer),
    # never in a pickle of its own; as the peer.
    raise RuntimeError("Can not pickle rref in python pickler, rref can only "
                       "be pickled when using RPC")


RRef.__reduce__ = _rref_reduce
# RRef[T] in annotations, as the peer's `def f(rref: RRef[nn.Module])`.
RRef.__class_getitem__ = classmethod(types.GenericAlias)


def _script_rref_annotations():
    """Lets ``@torch.jit.script`` compile tether's ``RRef[T]`` as
    TorchScript's RRef type, as it compiles the peer's: torch's annotation
    reader (torch.jit.annotations.is_rref) knows only the peer's class. The
    callee runs such functions with tether's RRef operators (_callee.serve,
    python/src/script.h)."""
    from torch.jit import annotations
    peer_is_rref = getattr(annotations, "is_rref", None)
    if peer_is_rref is None or getattr(peer_is_rref, "_tether", False):
        return

    def is_rref(ann):
        if getattr(ann, "__origin__", None) is RRef:
            return True
        return peer_is_rref(ann)

    is_rref._tether = True
    annotations.is_rref = is_rref


_script_rref_annotations()


class BackendType(enum.Enum):
    TENSORPIPE = "tensorpipe"
    GRPC = "grpc"
    LIBFABRIC = "libfabric"


def _typed(name, value, types_, what):
    if isinstance(value, bool) or not isinstance(value, types_):
        # The peer's options are a pybind11 class, whose words these are.
        raise TypeError("incompatible constructor arguments: %s must be %s, "
                        "got %s" % (name, what, type(value).__name__))
    return value


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
        here, besides __main__ and the program's own modules
        (docs/security.md).
    program_modules: whether the program's own modules (those beside its
        main script, outside the standard library and site-packages) are
        as trusted as its __main__ (default True; False: only __main__ and
        allowed_modules).
    init_timeout: bound of the rendezvous, in seconds.
    spare_core_poll: how long, in seconds, a waiting thread polls before
        it sleeps (the backend's thread after its last message, a caller
        waiting for a result) while no thread of the machine waits for a
        core: it saves wake-ups and costs nobody a core (default 100e-6;
        0: sleep at once; RpcOptions::spare_core_poll).
    busy_poll: the same, whatever the load: spends a core while calls
        come (0, the default: off; RpcOptions::busy_poll).
    _transports, _channels: the peer's TensorPipe lists, as settings.
    """

    def __init__(self, num_worker_threads=16,
                 rpc_timeout=DEFAULT_RPC_TIMEOUT_SEC, init_method="env://",
                 backend_settings=None, auth_secret=None, allowed_modules=(),
                 init_timeout=60.0, device_maps=None, devices=None,
                 _transports=None, _channels=None, busy_poll=0.0,
                 program_modules=True, spare_core_poll=100e-6):
        if device_maps or devices:
            raise ValueError("device_maps and devices name CUDA devices; "
                             "tether for Python moves CPU tensors only")
        self.num_worker_threads = _typed(
            "num_worker_threads", num_worker_threads, int, "an int")
        self.rpc_timeout = float(_typed(
            "rpc_timeout", rpc_timeout, (int, float),
            "a number of seconds (int or float)"))
        init_timeout = _typed("init_timeout", init_timeout, (int, float),
                              "a number of seconds (int or float)")
        _typed("init_method", init_method, str, "a str")
        self.init_method = init_method
        self.backend_settings = dict(backend_settings or {})
        if _transports:
            self.backend_settings["tensorpipe.transports"] = ",".join(
                _transports)
        if _channels:
            self.backend_settings["tensorpipe.channels"] = ",".join(_channels)
        self.auth_secret = auth_secret
        self.allowed_modules = tuple(allowed_modules)
        self.program_modules = bool(program_modules)
        self.init_timeout = float(init_timeout)
        for field, value in (("busy_poll", busy_poll),
                             ("spare_core_poll", spare_core_poll)):
            value = _typed(field, value, (int, float),
                           "a number of seconds (int or float)")
            if value < 0:
                raise ValueError("%s must be 0 or more seconds, got %r"
                                 % (field, value))
            setattr(self, field, float(value))


# The peer's programs name the TensorPipe options class.
TensorPipeRpcBackendOptions = RpcBackendOptions

_state_lock = threading.Lock()
_atexit_registered = False


def _backend_name(backend):
    if backend is None:
        # Set but empty is unset, as the ecosystem reads its variables.
        backend = os.environ.get("TETHER_BACKEND") or "tensorpipe"
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


# Where launchers put the world size and the rank (core/rendezvous.h,
# launcher_env()).
_LAUNCHER_WORLD_SIZES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
_LAUNCHER_RANKS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def _check_dynamic_rank(init_method, rank):
    """A worker joining a dynamic group must have a rank: the peer's
    ValueError and texts (its rendezvous handlers'), then tether's."""
    if rank not in (None, -1) or any(v in os.environ for v in _LAUNCHER_RANKS):
        return
    scheme = str(init_method).partition("://")[0] or "env"
    if scheme == "env":
        why = "environment variable RANK expected, but not set"
    else:
        why = "rank parameter missing"
    raise ValueError(
        "Error initializing torch.distributed using %s:// rendezvous: %s "
        "(a worker joining a dynamic group at %r needs its rank: give "
        "init_rpc(rank=) or set one of %s)"
        % (scheme, why, init_method, ", ".join(_LAUNCHER_RANKS)))


def init_rpc(name, backend=None, rank=-1, world_size=None,
             rpc_backend_options=None, master_endpoint=None):
    """Joins the group as worker ``name``. ``rank`` -1 and ``world_size``
    None are read from the environment (RANK/WORLD_SIZE, Slurm, Open MPI);
    with no world size there either, the group is dynamic, as the peer's:
    workers join it with their own ``rank`` and leave it at ``shutdown()``
    (tensorpipe and grpc).
    ``backend`` None is the TETHER_BACKEND environment variable, else
    tensorpipe.

    Paddle's form works too: ``init_rpc(name, rank, world_size,
    master_endpoint="ip:port")`` (positional or by keyword), where
    ``master_endpoint`` is where the group meets (rank 0 serves it), as
    ``init_method="tcp://ip:port"``; PADDLE_TRAINER_ID,
    PADDLE_TRAINERS_NUM and PADDLE_MASTER_ENDPOINT stand in for what is
    not given, as in Paddle."""
    global _atexit_registered
    if isinstance(backend, int) and not isinstance(backend, bool):
        # Paddle's positional order, (name, rank, world_size,
        # master_endpoint), shifted onto the peer's: no backend is an int.
        if rank != -1:  # world_size came second
            if isinstance(world_size, str) and master_endpoint is None:
                master_endpoint = world_size
            world_size = rank
        rank, backend = backend, None
    if master_endpoint is None and rpc_backend_options is None:
        master_endpoint = os.environ.get("PADDLE_MASTER_ENDPOINT")
    if master_endpoint is not None:
        if rank in (None, -1) and "PADDLE_TRAINER_ID" in os.environ:
            rank = int(os.environ["PADDLE_TRAINER_ID"])
        if world_size is None and "PADDLE_TRAINERS_NUM" in os.environ:
            world_size = int(os.environ["PADDLE_TRAINERS_NUM"])
        rpc_backend_options = _with_master_endpoint(rpc_backend_options,
                                                    master_endpoint)
    if rpc_backend_options is not None and not isinstance(
            rpc_backend_options, RpcBackendOptions):
        raise TypeError("Argument rpc_backend_options must be an instance of "
                        "RpcBackendOptions, got %s"
                        % type(rpc_backend_options).__name__)
    if world_size is None and not any(
            v in os.environ for v in _LAUNCHER_WORLD_SIZES):
        # As the peer: no world size anywhere is a dynamic group, joined
        # and left while it runs (docs/reliability.md, "Groups that change").
        world_size = 0
    options = rpc_backend_options or RpcBackendOptions()
    if world_size == 0:
        _check_dynamic_rank(options.init_method, rank)
    for module in options.allowed_modules:
        allow_module(module)
    _callee.trust_program_modules(getattr(options, "program_modules", True))
    _endpoints.clear()  # a new group
    _C.init_rpc(
        name, -1 if rank is None else int(rank),
        -1 if world_size is None else int(world_size), _backend_name(backend),
        options.init_method, options.num_worker_threads, options.rpc_timeout,
        options.init_timeout, options.backend_settings,
        options.auth_secret or "", _callee.serve, _callee.Failure,
        getattr(options, "busy_poll", 0.0),
        getattr(options, "spare_core_poll", 100e-6))
    with _state_lock:
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True


def _with_master_endpoint(options, endpoint):
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError("master_endpoint must be 'ip:port', got %r"
                         % (endpoint,))
    if options is None:
        options = RpcBackendOptions()
    elif options.init_method not in ("env://", None):
        raise ValueError("give either master_endpoint (%r) or "
                         "rpc_backend_options.init_method (%r), not both"
                         % (endpoint, options.init_method))
    else:
        options = copy.copy(options)  # the caller's stays as it was
    options.init_method = "tcp://%s:%s" % (host.strip("[]"), port)
    return options


def shutdown(graceful=True, timeout=DEFAULT_SHUTDOWN_TIMEOUT):
    """Graceful: waits until every worker has called shutdown and no call
    is in flight anywhere, then stops. Otherwise stops at once.

    ``timeout`` bounds the graceful wait, in seconds (0: none, the default;
    a lost worker ends the wait anyway, naming it). Past it this worker
    stops all the same and a RuntimeError names who was still missing."""
    _C.shutdown(bool(graceful), float(timeout))


def get_worker_info(worker_name=None):
    return _C.get_worker_info(worker_name)


def get_current_worker_info():
    """This worker's WorkerInfo (Paddle's name for get_worker_info())."""
    return _C.get_worker_info(None)


def get_all_worker_infos():
    """Every worker of the group, by rank."""
    return _C.get_all_worker_infos()


def get_rpc_timeout():
    """The default call bound of this worker, in seconds (0: none)."""
    return _C.get_rpc_timeout()


def _set_rpc_timeout(rpc_timeout):
    """Sets the default call bound of this worker, in seconds (0: none),
    for calls made from now on; as the peer's rpc._set_rpc_timeout."""
    _C.set_rpc_timeout(float(rpc_timeout))


# The peer's helpers under their private names (rpc.api._all_gather, ...),
# which its programs and tests use; tether has each as a public mechanism.


def _all_gather(obj, worker_names=None, timeout=UNSET_RPC_TIMEOUT):
    """Gathers ``obj`` (a wire value) from every worker of ``worker_names``
    (default: the whole group; it must include this worker) and returns
    {name: obj} once all have given theirs; as the peer's
    rpc.api._all_gather, over tether's Worker::all_gather. ``timeout`` in
    seconds: -1 the RPC timeout, 0 none; a lost worker ends the wait
    anyway, naming it."""
    return _C.all_gather(obj, sorted(worker_names or ()), float(timeout))


def _barrier(worker_names):
    """Returns once every worker of ``worker_names`` has called it (the
    peer's rpc.api._barrier); bounded by the RPC timeout."""
    _all_gather(None, worker_names)


def _wait_all_workers(timeout=DEFAULT_SHUTDOWN_TIMEOUT):
    """Returns once every worker of the group has called it (the peer's
    rpc.api._wait_all_workers, the barrier of its graceful shutdown);
    ``timeout`` in seconds, 0 none."""
    _all_gather(None, None, timeout)


def _rref_context_get_debug_info():
    """The RRef layer's counts on this worker, with the peer's keys and
    values as text: num_owner_rrefs (values owned here that peers use),
    num_forks (the users of them that the owner knows of),
    num_pending_users (users made here that their owner has not confirmed
    yet) and num_pending_futures (RRefs sent on from here whose owner has
    not confirmed the new user yet; the peer counts its fork requests in
    flight). Its programs wait for the last two to reach 0."""
    return _C.rref_debug_info()


class _CurrentAgent:
    """What the peer's programs read of its agent object
    (rpc.api._get_current_rpc_agent()): the group's WorkerInfos and its
    debug info."""

    def get_worker_info(self, worker_name=None):
        return get_worker_info(worker_name)

    def get_worker_infos(self):
        return get_all_worker_infos()

    def get_debug_info(self):
        """The worker pool's size and idle threads, with the peer's keys
        (agent.thread_pool_size, agent.num_idle_threads), and while GIL
        profiling is on (enable_gil_profiling) the average wait of the
        Python functions peers called here for the GIL
        (agent.gil_average_wait_time_us); values as text."""
        return _C.agent_debug_info()


def enable_gil_profiling(flag):
    """The peer's rpc.enable_gil_profiling: while on, each Python function
    a peer calls on this worker times its wait for the GIL, and the agent's
    debug info reports the average (agent.gil_average_wait_time_us). Off
    by default."""
    _C.enable_gil_profiling(bool(flag))


def _get_debug_info():
    """The peer's rpc._get_debug_info(): the agent's, the RRef context's
    and distributed autograd's debug info in one dict."""
    info = _C.agent_debug_info()
    info.update(_rref_context_get_debug_info())
    info.update(_C.autograd_debug_info())
    return info


def _get_current_rpc_agent():
    get_worker_info()  # raises as every call does before init_rpc
    return _CurrentAgent()


_thread_local_var = threading.local()


@contextlib.contextmanager
def _wait_all():
    """Collects the futures rpc_async returns on this thread inside the
    block and waits for all of them at its end, raising the first error
    (the peer's rpc.api._wait_all)."""
    _thread_local_var.future_list = []
    try:
        yield
    finally:
        try:
            torch.futures.wait_all(_thread_local_var.future_list)
        finally:
            del _thread_local_var.future_list


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
        # By reference as any function: the callee runs its own scripted
        # function of that name.
        module, name = _callee.script_location(func)
        name = _callee.reference(module, name)
        _names[func] = (name, False)
        return name, False
    name = _find_builtin(func)
    inplace = False
    if name is None:
        name = _functional_operator(func)
        inplace = name is not None
    if name is None and inspect.ismethod(func) and not inspect.isclass(
            func.__self__):
        raise TypeError(
            "cannot call %s remotely: it is a method bound to a %s object, "
            "which would have to travel pickled; call a module-level "
            "function, or keep the object on its owner with remote() and "
            "pass the RRef" % (func.__qualname__,
                               type(func.__self__).__qualname__))
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


def _reference_value(obj):
    """The name a function or class argument travels by (tether._C calls
    this for an argument that is no wire value), or None for other
    objects. As for ``func``: by reference, resolved on the callee under
    its policy (tether.rpc._callee.resolve_value); a lambda or a bound
    method is a TypeError."""
    if not (inspect.isroutine(obj) or inspect.isclass(obj)
            or isinstance(obj, torch.jit.ScriptFunction)):
        return None
    return _function_name(obj)[0]


def _call_parts(func, args, kwargs):
    bound_to = None
    if inspect.ismethod(func) and not inspect.isclass(func.__self__):
        # obj.method(*args) is type(obj).method(obj, *args): the function
        # travels by reference and the object by value (pickled), as the
        # peer sends it.
        bound_to, func = func.__self__, func.__func__
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
    if bound_to is not None:
        args = (bound_to,) + args
    return name, args, kwargs


def _profiled(exec_type, func, name, to):
    # The record_function and key of a call under the legacy profiler
    # (tether.rpc._profiling).
    return _profiling.record(exec_type, func, name,
                             get_worker_info().name,
                             get_worker_info(to).name)


def rpc_sync(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs ``func(*args, **kwargs)`` on worker ``to`` and returns its
    result. ``timeout`` in seconds: -1 the default, 0 none."""
    name, args, kwargs = _call_parts(func, args, kwargs)
    if not _profiling.enabled():
        return _C.rpc_sync(to, name, args, kwargs, float(timeout), None)
    record, key = _profiled(RPCExecMode.SYNC, func, name, to)
    with record:
        return _C.rpc_sync(to, name, args, kwargs, float(timeout), key)


def rpc_async(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """As rpc_sync, returning a torch.futures.Future of the result."""
    name, args, kwargs = _call_parts(func, args, kwargs)
    if not _profiling.enabled():
        future = _C.rpc_async(to, name, args, kwargs, float(timeout), None)
    else:
        record, key = _profiled(RPCExecMode.ASYNC, func, name, to)
        with record:
            future = _C.rpc_async(to, name, args, kwargs, float(timeout), key)
            # The call's event ends when its answer has come (and with it
            # the callee's events), before the future completes.
            future = record._call_end_callbacks_on_future(future)
    collected = getattr(_thread_local_var, "future_list", None)
    if collected is not None:
        collected.append(future)
    return future


def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs ``func`` on ``to`` and keeps the result there; returns an RRef
    at once. A failure is raised by the RRef's first use."""
    name, args, kwargs = _call_parts(func, args, kwargs)
    if not _profiling.enabled():
        return _C.remote(to, name, args, kwargs, float(timeout), None)
    record, key = _profiled(RPCExecMode.REMOTE, func, name, to)
    with record:
        rref = _C.remote(to, name, args, kwargs, float(timeout), key)
        rref._set_profiling_future(
            record._call_end_callbacks_on_future(rref._get_future()))
    return rref


def _set_profiling_future(rref, future):
    rref._tether_profiling_future = future


def _get_profiling_future(rref):
    """The peer's rref._get_profiling_future(): of a remote() made under
    the legacy profiler, a future that completes once the owner has made
    the value and the call's event (with the owner's events) is recorded."""
    try:
        return rref._tether_profiling_future
    except AttributeError:
        raise RuntimeError(
            "this RRef has no profiling future: it was not made by "
            "remote() under the legacy profiler") from None


RRef._set_profiling_future = _set_profiling_future
RRef._get_profiling_future = _get_profiling_future
