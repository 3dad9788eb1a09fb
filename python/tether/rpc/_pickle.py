"""Python objects that are not wire values, as they travel: pickled by the
sender, unpickled by the receiver under the receiver's own policy
(docs/security.md).

The convention is ``torch.load(weights_only=True)``'s: the unpickler
resolves a global only if

- this worker's call policy already lets a peer call it (its ``__main__``,
  the program's own modules, allowed modules, ``@tether.rpc.expose``;
  ``_callee.resolve_value``), or
- it is one of the reviewed reconstructors in ``_SAFE`` (numpy arrays,
  dtypes and scalars, ``OrderedDict``, sets, complex, slices, torch's
  parameters, sizes, devices and dtypes, tether's RemoteModule reference),
  or a ``torch.nn`` module class (rebuilt from its state, never called), or
- the program registered it with ``add_safe_globals``.

Everything else is refused, naming the global and how to allow it. A peer
that may call the allowed functions gains nothing from this: what the
unpickler may call is what such a peer may call anyway, plus constructors
that build plain data from bytes the pickle holds (each bounded by the
pickle's own size). The unpickler is pickle's own pure-Python one with its
dangerous opcodes narrowed: REDUCE calls only allowed callables, NEWOBJ
builds only allowed classes, BUILD and the container opcodes change only
objects this unpickling made, the extension registry and protocol 0's
INST/OBJ are refused, and containers nest at most ``MAX_DEPTH`` deep.

Tensors (exactly ``torch.Tensor``) and RRefs inside an object are lifted
out of the pickle as persistent ids: tether's codec moves them (tensors
out of band, RRefs forked) and the unpickler puts them back.
"""
import collections
import importlib
import io
import pickle
import sys
import threading

import torch

from tether import _C
from tether.rpc import _callee, _errors

# Containers nested in one pickled object, and the opcodes it may run, as
# the wire's own max_depth and max_values (core/wire/codec.h, Limits).
MAX_DEPTH = 64
MAX_OPCODES = 1 << 22

_RRef = _C.RRef


class Refused(_callee.Failure, RuntimeError):
    """A value this worker will not unpickle: (absl status code, text). A
    callee returns it as the call's Status; a caller raises it as the
    RuntimeError it is."""

    def __str__(self):
        return self.args[1]


class _Pickler(pickle.Pickler):
    def __init__(self, file, objects):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._objects = objects

    def persistent_id(self, obj):
        # A Parameter is pickled (torch._utils._rebuild_parameter over its
        # lifted data) so that it arrives a Parameter.
        if type(obj) is torch.Tensor or isinstance(obj, _RRef):
            self._objects.append(obj)
            return len(self._objects) - 1
        return None


def dumps(obj):
    """(pickle bytes, [tensors and RRefs it names by index]). Raises
    TypeError naming why if ``obj`` cannot be pickled."""
    objects = []
    out = io.BytesIO()
    try:
        _Pickler(out, objects).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError,
            RecursionError) as e:
        raise TypeError("it cannot be pickled: %s" % (e,)) from None
    return out.getvalue(), objects


# ---- What the receiver resolves ----

_lock = threading.Lock()
_user_safe = {}  # (module, qualname) -> object, from add_safe_globals


def add_safe_globals(safe_globals):
    """Lets objects pickled by peers name these functions and classes on
    this worker (as ``torch.serialization.add_safe_globals`` does for
    ``torch.load(weights_only=True)``): a class so named is rebuilt from
    its pickled state, a function is called with pickled arguments. Allow
    only what is safe to run with arguments a peer chooses."""
    for obj in safe_globals:
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if not module or not qualname or "<" in qualname:
            raise TypeError("add_safe_globals takes module-level functions "
                            "and classes, not %r" % (obj,))
        if module == "__mp_main__":
            module = "__main__"
        with _lock:
            _user_safe[(module, qualname)] = obj


def get_safe_globals():
    with _lock:
        return list(_user_safe.values())


def clear_safe_globals():
    with _lock:
        _user_safe.clear()


def _numpy_reconstruct(module):
    # numpy's ndarray.__reduce__ names _reconstruct(ndarray, (0,), b'b') and
    # then sets the real shape and data (bounded by the pickle's bytes) in
    # ndarray.__setstate__. A larger start would allocate what the peer
    # asks for (an object array is zero-filled), so only an empty one is.
    def reconstruct(subtype, shape, dtype):
        numpy = importlib.import_module("numpy")
        if (not isinstance(subtype, type)
                or not issubclass(subtype, numpy.ndarray)
                or type(shape) is not tuple or not shape
                or any(type(d) is not int or d != 0 for d in shape)):
            raise _refused(module + "._reconstruct", "with %r (only the "
                           "empty start numpy itself pickles is rebuilt)"
                           % ((subtype, shape, dtype),))
        return importlib.import_module(module)._reconstruct(subtype, shape,
                                                            dtype)
    return lambda: reconstruct


def _getattr(obj, name):
    # pickle's form of a bound method, getattr(obj, "method"): read here, on
    # an object this unpickling made or a global it may name (the
    # unpickler checks which), and never a dunder name. What it reads is a
    # value: the unpickler calls only globals.
    if type(name) is not str or name.startswith("__"):
        raise _refused("builtins.getattr", "for the attribute %r (only "
                       "methods by name, never dunder ones)" % (name,))
    return getattr(obj, name)


def _torch_dtype(name):
    value = getattr(torch, name, None)
    return value if isinstance(value, torch.dtype) else None


# (module, qualname) -> (kind, how to get it). Kinds: "call" (REDUCE may
# call it), "class" (NEWOBJ may make one; it may also be called), "value"
# (only named, as numpy.ndarray is named to _reconstruct).
def _numpy(module, name):
    return lambda: getattr(importlib.import_module(module), name)


_SAFE = {
    ("collections", "OrderedDict"): ("class", lambda: collections.OrderedDict),
    ("builtins", "getattr"): ("call", lambda: _getattr),
    ("builtins", "bool"): ("class", lambda: bool),
    ("builtins", "int"): ("class", lambda: int),
    ("builtins", "float"): ("class", lambda: float),
    ("builtins", "str"): ("class", lambda: str),
    ("builtins", "dict"): ("class", lambda: dict),
    ("builtins", "list"): ("class", lambda: list),
    ("builtins", "tuple"): ("class", lambda: tuple),
    ("builtins", "set"): ("class", lambda: set),
    ("builtins", "frozenset"): ("class", lambda: frozenset),
    ("builtins", "complex"): ("call", lambda: complex),
    ("builtins", "slice"): ("call", lambda: slice),
    ("tether._C", "WorkerInfo"): ("call", lambda: _C.WorkerInfo),
    ("torch", "Size"): ("call", lambda: torch.Size),
    ("torch", "device"): ("call", lambda: torch.device),
    ("torch._utils", "_rebuild_parameter"):
        ("call", lambda: torch._utils._rebuild_parameter),
    ("torch._utils", "_rebuild_parameter_with_state"):
        ("call", lambda: torch._utils._rebuild_parameter_with_state),
    ("tether.nn.api.remote_module", "_remote_module_from_reference"):
        ("call", lambda: importlib.import_module(
            "tether.nn.api.remote_module")._remote_module_from_reference),
}
for _np in ("numpy.core", "numpy._core"):
    _SAFE[(_np + ".multiarray", "_reconstruct")] = (
        "call", _numpy_reconstruct(_np + ".multiarray"))
    _SAFE[(_np + ".multiarray", "scalar")] = (
        "call", _numpy(_np + ".multiarray", "scalar"))
    # Protocol 5's contiguous arrays: a view of the pickle's own buffer.
    _SAFE[(_np + ".numeric", "_frombuffer")] = (
        "call", _numpy(_np + ".numeric", "_frombuffer"))
_SAFE[("numpy", "dtype")] = ("call", _numpy("numpy", "dtype"))
_SAFE[("numpy", "ndarray")] = ("value", _numpy("numpy", "ndarray"))
del _np


class _Global:
    """A resolved global and what the unpickler may do with it."""
    __slots__ = ("obj", "may_call", "may_make")

    def __init__(self, obj, may_call, may_make):
        self.obj, self.may_call, self.may_make = obj, may_call, may_make


def _refused(name, why):
    return Refused(_errors.PERMISSION_DENIED, (
        "refused to unpickle a value sent by a peer: the global %s is not "
        "allowed on this worker %s. Objects travel pickled and are rebuilt "
        "only from this worker's own functions and classes (its __main__, "
        "the program's own modules, allowed_modules, @tether.rpc.expose) "
        "and numpy, torch.nn and plain containers; if you trust it, allow it "
        "with tether.rpc.add_safe_globals([...]) or "
        "tether.rpc.allow_module(name) (docs/security.md)") % (name, why))


def _torch_nn_class(module, qualname):
    """A torch.nn module class torch has imported (rebuilt from its state
    by NEWOBJ and BUILD, never called)."""
    if not module.startswith("torch.nn.modules.") or "." in qualname:
        return None
    found = getattr(sys.modules.get(module), qualname, None)
    if (isinstance(found, type) and issubclass(found, torch.nn.Module)
            and found.__module__ == module and found.__qualname__ == qualname):
        return found
    return None


def _resolve_global(module, qualname):
    if module == "__mp_main__":
        module = "__main__"
    name = "%s.%s" % (module, qualname)
    with _lock:
        user = _user_safe.get((module, qualname))
    if user is not None:
        return _Global(user, True, isinstance(user, type))
    safe = _SAFE.get((module, qualname))
    if safe is not None:
        kind, get = safe
        try:
            obj = get()
        except (ImportError, AttributeError) as e:
            raise Refused(_errors.NOT_FOUND, "cannot rebuild %s: %s"
                                  % (name, e)) from None
        return _Global(obj, kind != "value", kind == "class")
    if module == "torch" and _torch_dtype(qualname) is not None:
        return _Global(_torch_dtype(qualname), False, False)
    nn_class = _torch_nn_class(module, qualname)
    if nn_class is not None:
        return _Global(nn_class, False, True)
    try:
        obj = _callee.resolve_value(_callee.reference(module, qualname))
    except _callee.Failure as e:
        if e.args[0] == _errors.PERMISSION_DENIED:
            # "refused to run NAME: WHY. This worker runs only ..."
            why = e.args[1].split(". This worker", 1)[0].split(": ", 1)[-1]
            raise _refused(name, "(%s)" % (why,)) from None
        raise
    return _Global(obj, True, isinstance(obj, type))


def _check_depth(unpickler):
    if len(unpickler.metastack) >= MAX_DEPTH:
        raise Refused(_errors.RESOURCE_EXHAUSTED, (
            "refused to unpickle a value sent by a peer: containers nested "
            "deeper than %d" % (MAX_DEPTH,)))


class _Unpickler(pickle._Unpickler):
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, data, objects):
        self._file = io.BytesIO(data)
        super().__init__(self._file)
        self._objects = objects
        # Objects resolved from globals, and objects this unpickling made
        # (the only ones BUILD and the container opcodes may change).
        self._globals = {}
        self._made = {}  # id -> object (kept, so that ids stay unique)

    def load(self):
        # pickle._Unpickler.load with the opcodes counted, reading the
        # in-memory pickle directly (its frames need no unframing).
        self.read = self._file.read
        self.readinto = self._file.readinto
        self.readline = self._file.readline
        self.metastack = []
        self.stack = []
        self.append = self.stack.append
        self.proto = 0
        read = self.read
        dispatch = self.dispatch
        try:
            for _ in range(MAX_OPCODES):
                key = read(1)
                if not key:
                    raise EOFError
                dispatch[key[0]](self)
        except pickle._Stop as stop:
            return stop.value
        raise Refused(_errors.RESOURCE_EXHAUSTED, (
            "refused to unpickle a value sent by a peer: more than %d "
            "opcodes" % (MAX_OPCODES,)))

    def find_class(self, module, name):
        if type(module) is not str or type(name) is not str:
            raise _refused(repr((module, name)), "(not a name)")
        entry = _resolve_global(module, name)
        self._globals[id(entry.obj)] = entry
        return entry.obj

    def persistent_load(self, pid):
        if type(pid) is not int or not 0 <= pid < len(self._objects):
            raise Refused(_errors.INVALID_ARGUMENT, (
                "a pickled value names object %r, but %d travelled with it"
                % (pid, len(self._objects))))
        return self._objects[pid]

    def _entry(self, obj):
        entry = self._globals.get(id(obj))
        return entry if entry is not None and entry.obj is obj else None

    def _made_here(self, obj):
        if self._made.get(id(obj)) is obj:
            return
        if type(obj) in (list, dict, set):  # plain containers: harmless
            return
        raise Refused(_errors.PERMISSION_DENIED, (
            "refused to unpickle a value sent by a peer: it changes a %s "
            "it did not make" % (type(obj).__qualname__,)))

    def load_reduce(self):
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        entry = self._entry(func)
        if entry is None or not entry.may_call:
            raise _refused(getattr(func, "__qualname__", repr(func)),
                           "(it may not be called while unpickling)")
        if type(args) is not tuple:
            raise Refused(_errors.INVALID_ARGUMENT,
                                  "a pickled call's arguments are no tuple")
        if func is _getattr and (len(args) != 2 or (
                self._made.get(id(args[0])) is not args[0]
                and self._entry(args[0]) is None)):
            raise _refused("builtins.getattr", "on an object the pickle "
                           "neither made nor named")
        made = func(*args)
        self._made[id(made)] = made
        stack[-1] = made
    dispatch[pickle.REDUCE[0]] = load_reduce

    def _new(self, cls, args, kwargs):
        entry = self._entry(cls)
        if entry is None or not entry.may_make or not isinstance(cls, type):
            raise _refused(getattr(cls, "__qualname__", repr(cls)),
                           "(it may not be instantiated while unpickling)")
        if type(args) is not tuple or type(kwargs) is not dict:
            raise Refused(_errors.INVALID_ARGUMENT,
                                  "a pickled object's arguments are malformed")
        made = cls.__new__(cls, *args, **kwargs)
        self._made[id(made)] = made
        return made

    def load_newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, {}))
    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self):
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, kwargs))
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def load_build(self):
        self._made_here(self.stack[-2])  # the object; its state is on top
        pickle._Unpickler.load_build(self)
    dispatch[pickle.BUILD[0]] = load_build

    def load_appends(self):
        self._made_here(self.metastack[-1][-1] if self.metastack else None)
        pickle._Unpickler.load_appends(self)
    dispatch[pickle.APPENDS[0]] = load_appends

    def load_append(self):
        self._made_here(self.stack[-2])
        pickle._Unpickler.load_append(self)
    dispatch[pickle.APPEND[0]] = load_append

    def load_setitem(self):
        self._made_here(self.stack[-3])
        pickle._Unpickler.load_setitem(self)
    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        self._made_here(self.metastack[-1][-1] if self.metastack else None)
        pickle._Unpickler.load_setitems(self)
    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_additems(self):
        self._made_here(self.metastack[-1][-1] if self.metastack else None)
        pickle._Unpickler.load_additems(self)
    dispatch[pickle.ADDITEMS[0]] = load_additems

    def load_frame(self):
        # A frame's length; the bytes are in memory already.
        if len(self.read(8)) != 8:
            raise pickle.UnpicklingError("pickle data was truncated")
    dispatch[pickle.FRAME[0]] = load_frame

    def load_mark(self):
        _check_depth(self)
        pickle._Unpickler.load_mark(self)
    dispatch[pickle.MARK[0]] = load_mark

    def _refuse_opcode(self):
        raise Refused(_errors.PERMISSION_DENIED, (
            "refused to unpickle a value sent by a peer: it uses an opcode "
            "(INST, OBJ or the extension registry) that tether never "
            "writes"))
    for _op in (pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2,
                pickle.EXT4):
        dispatch[_op[0]] = _refuse_opcode
    del _op


_CONTAINERS = (list, tuple, dict, set, frozenset)


def _check_nesting(root):
    """Refuses containers nested deeper than MAX_DEPTH, however they were
    built (MARK is counted while loading; TUPLE1 chains and memo references
    are not). Each container is visited once; a cycle ends the path."""
    depth_of = {id(root): 1}
    pending = [(root, 1)]
    keep = [root]  # ids stay unique while the walk runs
    while pending:
        obj, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise Refused(_errors.RESOURCE_EXHAUSTED, (
                "refused to unpickle a value sent by a peer: containers "
                "nested deeper than %d" % (MAX_DEPTH,)))
        if isinstance(obj, dict):
            children = list(obj.keys()) + list(obj.values())
        else:
            children = obj
        for child in children:
            # A container met already (shared, or a cycle) is not walked
            # again.
            if isinstance(child, _CONTAINERS) and id(child) not in depth_of:
                depth_of[id(child)] = depth + 1
                keep.append(child)
                pending.append((child, depth + 1))


def loads(data, objects):
    """The object a peer pickled (``dumps``), rebuilt under this worker's
    policy; raises _callee.Failure naming what was refused."""
    try:
        value = _Unpickler(bytes(data), list(objects)).load()
        if isinstance(value, _CONTAINERS):
            _check_nesting(value)
        return value
    except Refused:
        raise
    except _callee.Failure as e:  # resolve_value's NOT_FOUND
        raise Refused(*e.args) from None
    except RecursionError:
        raise Refused(_errors.RESOURCE_EXHAUSTED, (
            "refused to unpickle a value sent by a peer: it nests too "
            "deep")) from None
    except Exception as e:  # malformed pickles: any error pickle raises
        raise Refused(_errors.INVALID_ARGUMENT, (
            "cannot unpickle a value sent by a peer: %s: %s"
            % (type(e).__name__, e))) from None
