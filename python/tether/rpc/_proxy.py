"""RRef proxies, as the peer's (torch/distributed/rpc/rref_proxy.py).

    rref.rpc_sync().forward(x)      # runs value.forward(x) on the owner
    rref.rpc_async().forward(x)     # a torch.futures.Future of it
    rref.remote().forward(x)        # an RRef of it, kept on the owner

A proxy call is a call of ``invoke`` on the RRef's owner with the RRef, the
method's name and the arguments (wire values, as for any call). ``invoke``
is one of tether's internal functions (_callee.INTERNAL, docs/security.md):
the owner runs it for any peer, and it calls only a public method or
``__call__`` of the object the RRef holds there.

As the peer's, a proxy first learns the type of the owner's value
(``rref._get_type()``, one call per RRef object, then cached) and raises
AttributeError at the call when the type has no such method.
"""
import torch

from tether.rpc import _callee, _errors, functions

UNSET_RPC_TIMEOUT = -1.0


def _method_of(value, name):
    if not isinstance(name, str) or not name:
        raise _callee.Failure(_errors.INVALID_ARGUMENT,
                              "an RRef proxy needs a method name, got %r"
                              % (name,))
    if name.startswith("__") and name != "__call__":
        raise _callee.Failure(_errors.PERMISSION_DENIED, (
            "refused to call %s.%s through an RRef proxy: proxies call "
            "public methods (and __call__), never other dunder methods "
            "(docs/security.md)") % (type(value).__qualname__, name))
    method = getattr(value, name, None)
    if method is None or not callable(method):
        raise AttributeError("%s object has no attribute %r"
                             % (type(value).__qualname__, name))
    return method


def invoke(rref, name, args, kwargs):
    """On the owner: ``rref.local_value().name(*args, **kwargs)``."""
    method = _method_of(rref.local_value(), name)
    return functions.result_of(method, method(*args, **kwargs))


def _rref_typeof_on_owner(rref):
    """On the owner: the reference ("module:qualname") of the type of the
    RRef's value, once it exists (raising its creation error)."""
    kind = type(rref.local_value())
    return _callee.type_reference(kind)


def _future_of(fn):
    # A done torch.futures.Future of fn()'s result or exception.
    fut = torch.futures.Future()
    try:
        fut.set_result(fn())
    except Exception as e:  # the future carries it, as the peer's
        fut.set_exception(e)
    return fut


def _chain(source, fn, out=None):
    """A torch.futures.Future completed with fn(source's value), or with the
    exception either raised, of the type raised (Future.then would make it
    a RuntimeError)."""
    out = torch.futures.Future() if out is None else out

    def done(f):
        try:
            value = fn(f.value())
        except Exception as e:
            out.set_exception(e)
            return
        out.set_result(value)

    source.add_done_callback(done)
    return out


def _failed(fut):
    if not fut.done():
        return False
    try:
        fut.value()
    except Exception:
        return True
    return False


def get_type(rref, timeout=UNSET_RPC_TIMEOUT, blocking=True):
    """``rref._get_type(timeout=-1, blocking=True)``: the type of the RRef's
    value, as the peer's. On a user it is one call to the owner (an internal
    function, which waits there for the value), whose answer names the type
    by reference; this worker resolves it under its policy
    (_callee.resolve_type). The answer is cached on the RRef object; a
    failed one is not. ``blocking=False`` returns a torch.futures.Future
    (the same one while cached)."""
    fut = getattr(rref, "_tether_type", None)
    if fut is None or _failed(fut):
        if rref.is_owner():
            fut = _future_of(lambda: type(rref.local_value()))
        else:
            import tether.rpc as rpc
            fut = _chain(rpc.rpc_async(rref.owner(), _rref_typeof_on_owner,
                                       args=(rref,), timeout=timeout),
                         _callee.resolve_type)
        rref._tether_type = fut
    return fut.wait() if blocking else fut


def _check_method(kind, name):
    # As the peer: a method the type lacks is an AttributeError at the call
    # (type object 'X' has no attribute 'name'). Types that make attributes
    # on the fly (nn.Module's submodules) and script modules are left to
    # the owner.
    if (kind is None or "__getattr__" in dir(kind)
            or issubclass(kind, torch.jit.ScriptModule)):
        return
    getattr(kind, name)


def _type_or_none(fut):
    # The type, or None when this worker cannot resolve it (the owner's
    # class is not allowed here); creation errors and timeouts are raised.
    try:
        return fut.wait()
    except _callee.UnresolvedType:
        return None


class RRefProxy:
    """What ``rref.rpc_sync()`` (and the others) return: its attributes are
    the methods of the object the RRef holds."""

    def __init__(self, rref, rpc_api, timeout=UNSET_RPC_TIMEOUT):
        self.rref = rref
        self.rpc_api = rpc_api
        self.rpc_timeout = timeout

    def __getattr__(self, func_name):
        if func_name.startswith("__") and func_name != "__call__":
            raise AttributeError(func_name)
        rref, api, timeout = self.rref, self.rpc_api, self.rpc_timeout

        def call(*args, **kwargs):
            import tether.rpc as rpc

            def send(_=None):
                return getattr(rpc, api)(rref.owner(), invoke,
                                         args=(rref, func_name, args, kwargs),
                                         timeout=timeout)

            type_fut = get_type(rref, timeout, blocking=False)
            if api != "rpc_async" or type_fut.done():
                _check_method(_type_or_none(type_fut), func_name)
                return send()
            # rpc_async returns at once; a missing method or a timeout
            # waiting for the type surfaces through wait(), as the peer's.
            out = torch.futures.Future()

            def typed(f):
                try:
                    _check_method(_type_or_none(f), func_name)
                    _chain(send(), lambda value: value, out)
                except Exception as e:
                    out.set_exception(e)

            type_fut.add_done_callback(typed)
            return out

        call.__name__ = func_name
        return call

    def __repr__(self):
        return "RRefProxy(%r, %s)" % (self.rref, self.rpc_api)
