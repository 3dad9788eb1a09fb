"""Points the peer's module names at tether's (docs/peer_suite.md).

`install()` puts modules into sys.modules under the peer's names, before the
peer's test files are imported, so their unchanged

    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import RRef, WorkerInfo, _get_debug_info
    from torch.distributed.rpc.api import _use_rpc_pickler, _wait_all
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.optim import DistributedOptimizer

bind tether's objects:

- torch.distributed.rpc (and .api, .functions, .options): tether.rpc's names.
- .constants and .backend_registry: the peer's constants and
  `BackendType` / `construct_rpc_backend_options` over tether's.
- torch.distributed.autograd, torch.distributed.optim: tether.autograd and
  tether.optim when they exist.

A name the peer has and tether does not (the peer's internal debug APIs,
its pickler, its agent objects) is a `PeerOnly` placeholder: importing it
works, using it raises `PeerOnlyError` naming it, so a test that reaches one
fails with that name and is listed as excluded (peer_suite/exclusions.py).
PeerOnlyError is not a RuntimeError: a test expecting the peer's
RuntimeError cannot pass by touching a placeholder.
"""
import contextlib
import importlib
import sys
import types

PEER_RPC = "torch.distributed.rpc"


class PeerOnlyError(Exception):
    """A test used a name of the peer that tether does not have."""


# Modules whose private names are the peer's internals; their public names
# are API that tether has or should have.
_INTERNAL_MODULES = (PEER_RPC + ".internal", PEER_RPC + ".api")


def is_internal(name):
    module, _, attr = name.rpartition(".")
    return (attr.startswith("_") or module.startswith(_INTERNAL_MODULES)
            or "._" in module)


class PeerOnly:
    """Stands for the peer's ``name``; any use raises PeerOnlyError. Used as
    a decorator (``@rpc.functions.async_execution``) it gives a placeholder
    for the decorated function, so the test file still imports."""

    def __init__(self, name):
        self._name = name

    def _refuse(self, *args, **kwargs):
        if is_internal(self._name):
            why = "an internal API of the peer; tether has no such name"
        else:
            why = "public API of the peer that tether does not have yet"
        raise PeerOnlyError("%s is %s" % (self._name, why))

    def __call__(self, *args, **kwargs):
        if (len(args) == 1 and not kwargs and callable(args[0])
                and hasattr(args[0], "__qualname__")):
            return PeerOnly("%s(%s)" % (self._name, args[0].__qualname__))
        self._refuse()

    __enter__ = _refuse
    __iter__ = _refuse
    # `mode == RPCExecMode.SYNC` on a placeholder would be quietly False.
    __eq__ = _refuse
    __hash__ = object.__hash__

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return PeerOnly("%s.%s" % (self._name, attr))

    def __mro_entries__(self, bases):
        self._refuse()

    def __repr__(self):
        return "<peer-only %s>" % self._name


def _module(name, names, source=None):
    """A module `name` holding `names`; any other public-looking attribute
    it is asked for is a PeerOnly placeholder."""
    module = types.ModuleType(name, "tether's stand-in for the peer's %s"
                              % name)
    module.__dict__.update(names)

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return PeerOnly("%s.%s" % (name, attr))

    module.__getattr__ = __getattr__
    if source is not None:
        module.__file__ = getattr(source, "__file__", None)
    return module


def _public(module):
    return {k: v for k, v in vars(module).items()
            if not (k.startswith("__") and k.endswith("__"))}


def _optional(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _backend_registry(rpc):
    def construct_rpc_backend_options(backend, rpc_timeout=None,
                                      init_method=None,
                                      num_worker_threads=None, **kwargs):
        options = {}
        if rpc_timeout is not None:
            options["rpc_timeout"] = rpc_timeout
        if init_method is not None:
            options["init_method"] = init_method
        if num_worker_threads is not None:
            options["num_worker_threads"] = num_worker_threads
        options.update(kwargs)
        return rpc.RpcBackendOptions(**options)

    return {"BackendType": rpc.BackendType,
            "construct_rpc_backend_options": construct_rpc_backend_options}


@contextlib.contextmanager
def scripting_kept_importable():
    """While the peer's test files import: a function that
    `@torch.jit.script` cannot compile under tether's names (TorchScript
    knows only the peer's RRef type) becomes a PeerOnly placeholder naming
    it and why, instead of failing the whole file's import."""
    import torch
    script = torch.jit.script

    def keep_importable(obj, *args, **kwargs):
        try:
            return script(obj, *args, **kwargs)
        except Exception as e:  # TorchScript's compile errors vary in type
            reason = str(e).strip().splitlines()[0] if str(e).strip() else (
                type(e).__name__)
            return PeerOnly("torch.jit.script(%s) (%s)" % (
                getattr(obj, "__qualname__", repr(obj)), reason))

    torch.jit.script = keep_importable
    try:
        yield
    finally:
        torch.jit.script = script


def install():
    """Idempotent. Call before importing any of the peer's test modules."""
    if getattr(sys.modules.get(PEER_RPC), "_tether_stand_in", False):
        return
    import torch.distributed as dist
    import tether.rpc as rpc

    names = _public(rpc)
    names["_tether_stand_in"] = True
    api = _module(PEER_RPC + ".api", dict(names, _ignore_rref_leak=True))
    constants = _module(PEER_RPC + ".constants", {
        "DEFAULT_RPC_TIMEOUT_SEC": rpc.DEFAULT_RPC_TIMEOUT_SEC,
        "UNSET_RPC_TIMEOUT": rpc.UNSET_RPC_TIMEOUT,
        "DEFAULT_SHUTDOWN_TIMEOUT": getattr(rpc, "DEFAULT_SHUTDOWN_TIMEOUT",
                                            0.0),
        "DEFAULT_INIT_METHOD": "env://",
        "DEFAULT_NUM_WORKER_THREADS": 16,
    })
    registry = _module(PEER_RPC + ".backend_registry", _backend_registry(rpc))
    functions = _module(PEER_RPC + ".functions",
                        _public(getattr(rpc, "functions", types.ModuleType(
                            "none"))))
    options = _module(PEER_RPC + ".options", {
        "TensorPipeRpcBackendOptions": rpc.TensorPipeRpcBackendOptions})
    internal = _module(PEER_RPC + ".internal", {
        "RPCExecMode": rpc.RPCExecMode,
        "_build_rpc_profiling_key": rpc._build_rpc_profiling_key})
    stand_in = _module(PEER_RPC, dict(
        names, api=api, constants=constants, backend_registry=registry,
        functions=functions, options=options, internal=internal,
        is_available=lambda: True), rpc)
    stand_in.__path__ = []  # a package, so its submodules import
    modules = {PEER_RPC: stand_in, PEER_RPC + ".api": api,
               PEER_RPC + ".constants": constants,
               PEER_RPC + ".backend_registry": registry,
               PEER_RPC + ".functions": functions,
               PEER_RPC + ".options": options,
               PEER_RPC + ".internal": internal}
    for peer, ours in (("torch.distributed.autograd", "tether.autograd"),
                       ("torch.distributed.optim", "tether.optim")):
        module = _optional(ours)
        modules[peer] = (_module(peer, _public(module), module)
                         if module is not None else _module(peer, {}))
    sys.modules.update(modules)
    # `import torch.distributed.rpc as rpc` reads the attribute of the
    # parent package first.
    dist.rpc = stand_in
    dist.autograd = modules["torch.distributed.autograd"]
    dist.optim = modules["torch.distributed.optim"]
