"""What a worker runs for its peers: the allow policy (docs/security.md).

A peer names a Python function by reference, "py::MODULE:QUALNAME"; nothing
arrives as code (values that are objects are unpickled under this same
policy: tether.rpc._pickle). This worker runs it only if it is

- a function or class defined in its ``__main__`` module or in one of the
  program's own modules (those whose files lie in the main script's
  directory tree, outside the standard library and site-packages),
- defined in a module allowed at init (``allowed_modules``, or
  ``tether.rpc.allow_module``; a package allows its submodules),
- registered with the ``@tether.rpc.expose`` decorator, or
- one of the harmless builtins in ``HARMLESS_BUILTINS``,
- a module class of ``torch.nn`` (a subclass of ``torch.nn.Module``
  defined in ``torch.nn.modules``: computation on tensors, as torch's
  operators, which peers may call anyway), or
- an optimizer class of ``torch.optim`` (a subclass of
  ``torch.optim.Optimizer`` defined there: the DistributedOptimizer's
  owners build them over their parameters), or
- one of tether's own functions in ``INTERNAL`` (an RRef proxy's call of a
  method of the object the RRef holds, remote modules, the
  DistributedOptimizer's optimizers of Python classes, the parts of a
  checkpoint an owner writes and reads in the directories it serves).

A TorchScript function (``@torch.jit.script``) is named the same way, by
the module that defines it: the callee runs its own scripted function of
that name, under the same policy; no code travels.

The reference must name the object where it is defined: an attribute walk
(``__main__:os.system`` when the script imported os) finds an object whose
``__module__`` or ``__qualname__`` differs, and is refused; so are dunder and
``<locals>`` components. A module is imported only once the policy allows it.
Torch builtins do not come here: they travel as ATen operator names and core
picks the overload (core/callables.h).

tether._C calls ``serve`` on the worker pool, holding the GIL.
"""
import builtins
import importlib
import importlib.util
import inspect
import os
import sys
import threading
import traceback
import types

import torch

from tether import _C
from tether.rpc import _errors, functions

PREFIX = "py::"

HARMLESS_BUILTINS = frozenset({
    "abs", "all", "any", "divmod", "len", "max", "min", "round", "sorted",
    "sum",
})

# tether's own functions that peers call on a worker (RRef proxies, remote
# modules), allowed whether or not this worker has imported them yet.
INTERNAL = frozenset({
    "py::tether.rpc._proxy:invoke",
    "py::tether.rpc._proxy:_rref_typeof_on_owner",
    "py::tether.nn.api.remote_module:_parameter_rrefs",
    "py::tether.optim:_LocalOptimizer",
    "py::tether.optim:_local_optimizer_step",
    "py::tether.checkpoint:_write_part",
    "py::tether.checkpoint:_read_part",
})

_lock = threading.Lock()
_allowed_modules = set()
_exposed = {}   # "module:qualname" -> function
_resolved = {}  # full name -> callable, filled as calls are allowed


class Failure(Exception):
    """Raised by serve with (absl status code, text); tether._C returns it
    as the call's Status."""


def reference(module, qualname):
    if module == "__mp_main__":  # the main script under multiprocessing
        module = "__main__"
    return "%s%s:%s" % (PREFIX, module, qualname)


def script_location(fn):
    """(module, name) of the Python function a ScriptFunction was compiled
    from, read from its TorchScript qualified name
    ("__torch__.pkg.mod.fn"; "__torch__.fn" for __main__)."""
    qualified = fn.qualified_name
    if qualified.startswith("__torch__."):
        qualified = qualified[len("__torch__."):]
    module, _, name = qualified.rpartition(".")
    return module or "__main__", name


def allow_module(name):
    """Lets peers call the functions and classes defined in module ``name``
    (and its submodules) on this worker."""
    if not isinstance(name, str) or not name or name.startswith("."):
        raise ValueError("allow_module needs an absolute module name, got %r"
                         % (name,))
    with _lock:
        _allowed_modules.add(name)


def expose(fn):
    """Decorator: lets peers call ``fn`` on this worker, wherever it is
    defined."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise TypeError("only module-level functions and classes can be "
                        "exposed, not %r" % (fn,))
    with _lock:
        _exposed[reference(module, qualname)] = fn
    return fn


def _refuse(name, why):
    raise Failure(_errors.PERMISSION_DENIED, (
        "refused to run %s: %s. This worker runs only functions and classes "
        "of its __main__ module and the program's own modules (beside its "
        "main script), of modules allowed at init "
        "(rpc_backend_options allowed_modules=[...] or "
        "tether.rpc.allow_module(name)), functions decorated with "
        "@tether.rpc.expose, torch operators and the builtins %s "
        "(docs/security.md)") % (name, why, ", ".join(sorted(HARMLESS_BUILTINS))))


def _module_allowed(module):
    if module == "__main__":
        return True
    with _lock:
        if any(module == m or module.startswith(m + ".")
               for m in _allowed_modules):
            return True
    return _program_module(module)


_program_modules = {}  # top-level module name -> whether it is the program's
_trust_program = True


def trust_program_modules(trust):
    """Whether the program's own modules are as trusted as its __main__
    (RpcBackendOptions program_modules)."""
    global _trust_program
    with _lock:
        _trust_program = bool(trust)


def _installed_dirs():
    """Where installed code lives: the standard library, site-packages and
    dist-packages, and the packages of torch and tether themselves."""
    import site
    import sysconfig
    dirs = {sysconfig.get_paths().get(k) for k in
            ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    for package in (torch, sys.modules["tether"]):
        dirs.update(getattr(package, "__path__", ()))
    return [os.path.realpath(d) for d in dirs if d]


def _program_dir():
    """The directory of the program's main script, or None (python -c, an
    interactive interpreter)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.dirname(os.path.realpath(path)) if path else None


def _under(path, directory):
    return path == directory or path.startswith(directory.rstrip(os.sep)
                                                + os.sep)


def _program_module(module):
    """Whether ``module`` is one of the program's own modules: a module or
    package whose file lies in the directory tree of the main script and
    not in the standard library, site-packages or dist-packages. Decided by
    its top-level package, located without running any of its code."""
    top = module.partition(".")[0]
    with _lock:
        if not _trust_program:
            return False
        known = _program_modules.get(top)
    if known is not None:
        return known
    program = _program_dir()
    origin = None
    if program is not None:
        loaded = sys.modules.get(top)
        if loaded is not None:
            origin = getattr(loaded, "__file__", None)
        else:
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
            if spec is not None:
                origin = spec.origin
                if origin is None and spec.submodule_search_locations:
                    origin = list(spec.submodule_search_locations)[0]
    ours = False
    if origin and origin not in ("built-in", "frozen"):
        origin = os.path.realpath(origin)
        ours = (_under(origin, program) and "site-packages" not in origin
                and "dist-packages" not in origin
                and not any(_under(origin, d) for d in _installed_dirs()))
    with _lock:
        _program_modules[top] = ours
    return ours


def _torch_optimizer(module, qualname):
    """Whether module:qualname names an optimizer class of torch.optim
    (torch.optim.adadelta:Adadelta): looked up in torch.optim, which torch
    has imported, so nothing is imported or run here."""
    if module != "torch.optim" and not module.startswith("torch.optim."):
        return False
    found = sys.modules.get(module)
    if found is None or "." in qualname or qualname.startswith("_"):
        return False
    found = getattr(found, qualname, None)
    return (inspect.isclass(found)
            and issubclass(found, torch.optim.Optimizer)
            and found is not torch.optim.Optimizer
            and found.__module__ == module and found.__qualname__ == qualname)


def _torch_nn_module(module, qualname):
    """Whether module:qualname names a module class of torch.nn
    (torch.nn.modules.sparse:EmbeddingBag), looked up where torch has
    imported it: pure computation on tensors, as torch's operators are, so
    a peer may build one (RemoteModule(ps, nn.EmbeddingBag, ...))."""
    if not module.startswith("torch.nn.modules."):
        return False
    found = sys.modules.get(module)
    if found is None or "." in qualname or qualname.startswith("_"):
        return False
    found = getattr(found, qualname, None)
    return (inspect.isclass(found) and issubclass(found, torch.nn.Module)
            and found.__module__ == module and found.__qualname__ == qualname)


def _resolve(name):
    if not name.startswith(PREFIX) or ":" not in name[len(PREFIX):]:
        raise Failure(_errors.INVALID_ARGUMENT,
                      "malformed function reference %r: expected "
                      "'py::module:qualname'" % (name,))
    module, qualname = name[len(PREFIX):].split(":", 1)
    if name in INTERNAL:
        return getattr(importlib.import_module(module), qualname)
    with _lock:
        exposed = _exposed.get(name)
    if exposed is not None:
        return exposed
    if module == "builtins":
        if qualname not in HARMLESS_BUILTINS:
            _refuse("builtins." + qualname, "it is not a harmless builtin")
        return getattr(builtins, qualname)
    if (not _module_allowed(module) and not _torch_optimizer(module, qualname)
            and not _torch_nn_module(module, qualname)):
        _refuse("%s.%s" % (module, qualname),
                "module %r is not allowed" % (module,))
    parts = qualname.split(".")
    if any(not p or p.startswith("__") or p.startswith("<") for p in parts):
        _refuse("%s.%s" % (module, qualname),
                "a reference may not name dunder or local objects")
    if module == "__main__":
        target = sys.modules.get("__main__")
    else:
        try:
            target = importlib.import_module(module)
        except ImportError as e:
            raise Failure(_errors.NOT_FOUND, "cannot import module %r: %s"
                          % (module, e))
    for part in parts:
        target = getattr(target, part, None)
        if target is None:
            raise Failure(_errors.NOT_FOUND, "no function or class %r in "
                          "module %r of this worker" % (qualname, module))
    callable_ = target
    if inspect.ismethod(target) and inspect.isclass(target.__self__):
        # A classmethod: checked as the function it binds to its class.
        target = target.__func__
    if isinstance(target, torch.jit.ScriptFunction):
        defined_in, defined_as = script_location(target)
    else:
        defined_in = getattr(target, "__module__", None)
        defined_as = getattr(target, "__qualname__", None)
    if defined_in == "__mp_main__":
        defined_in = "__main__"
    if (not isinstance(target, (type, types.FunctionType,
                                torch.jit.ScriptFunction))
            or defined_in != module or defined_as != qualname):
        _refuse("%s.%s" % (module, qualname),
                "it is not a function or class defined there (it is %r)"
                % (target,))
    return callable_


class UnresolvedType(RuntimeError):
    """A type named by a peer (rref._get_type()) that this worker cannot
    find under its policy."""


def type_reference(kind):
    """"module:qualname" of class ``kind``, as resolve_type reads it."""
    module = kind.__module__
    if module == "__mp_main__":
        module = "__main__"
    return "%s:%s" % (module, kind.__qualname__)


def resolve_type(ref):
    """The class a peer named by type_reference. Nothing is called: a class
    of a module this worker has imported is looked up there; another
    module is imported only if the policy allows it (as for a call)."""
    module, sep, qualname = ref.partition(":")
    parts = qualname.split(".")
    if (not sep or not module
            or any(not p or p.startswith("<") for p in parts)):
        raise UnresolvedType("the owner names its value's type %r, which "
                             "is no class this worker can look up" % (ref,))
    if module == "__main__":
        target = sys.modules.get("__main__")
    elif module in sys.modules:
        target = sys.modules[module]
    elif _module_allowed(module):
        try:
            target = importlib.import_module(module)
        except ImportError as e:
            raise UnresolvedType("cannot import module %r for the type "
                                 "%s: %s" % (module, qualname, e)) from None
    else:
        raise UnresolvedType(
            "the owner's value is a %s.%s: this worker has not imported "
            "module %r and does not allow it (rpc_backend_options "
            "allowed_modules=[...] or tether.rpc.allow_module(name))"
            % (module, qualname, module))
    for part in parts:
        target = getattr(target, part, None)
    defined_in = getattr(target, "__module__", None)
    if defined_in == "__mp_main__":
        defined_in = "__main__"
    if (not isinstance(target, type) or defined_in != module
            or target.__qualname__ != qualname):
        raise UnresolvedType("no class %s in module %r of this worker"
                             % (qualname, module))
    return target


def _torch_operator(name):
    # The torch function that travels as operator `name` ("aten::add"):
    # torch.X, torch.nn.functional.X or torch.Tensor.X, if it is that
    # operator's.
    from torch.jit._builtins import _find_builtin
    from tether.rpc import _functional_operator
    short = name.partition("::")[2]
    if short and not short.startswith("_"):
        for holder in (torch, torch.nn.functional, torch.Tensor):
            fn = getattr(holder, short, None)
            if fn is not None and (_find_builtin(fn) == name
                                   or _functional_operator(fn) == name):
                return fn
    raise Failure(_errors.NOT_FOUND, "a function argument names the torch "
                  "operator %r, which this worker has no Python function "
                  "for" % (name,))


def resolve_value(name):
    """A function or class a peer passed as an argument value, by the name
    it travels by (as ``func``: "py::module:qualname" or a torch operator),
    under the same policy as a called function: refused (Failure) unless
    allowed, naming it and how to allow it. Nothing is called here."""
    if not name.startswith(PREFIX):
        return _torch_operator(name)
    fn = _resolved.get(name)
    if fn is None:
        fn = _resolve(name)
        _resolved[name] = fn
    return fn


def serve(name, args, kwargs):
    fn = _resolved.get(name)
    if fn is None:
        fn = _resolve(name)
        _resolved[name] = fn
    try:
        if (isinstance(fn, torch.jit.ScriptFunction)
                and _C.script_reads_rrefs(fn)):
            # It takes or reads RRefs: tether's RRef operators run them.
            return _C.call_script(fn, args, kwargs)
        return functions.result_of(fn, fn(*args, **kwargs))
    except Exception as e:  # the caller gets its type, text and traceback
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        tb = "".join(traceback.format_tb(e.__traceback__.tb_next))
        # As the peer, the worker that ran it logs it too.
        try:
            me = _C.get_worker_info(None)
        except RuntimeError:  # shutting down
            me = "this worker"
        print("On %s, calling %s:\n%s\nTraceback (most recent call last):"
              "\n%s" % (me, name, text, tb), file=sys.stderr, flush=True)
        raise Failure(_errors.UNKNOWN,
                      "%s\nTraceback (most recent call last):\n%s"
                      % (text, tb)) from None
