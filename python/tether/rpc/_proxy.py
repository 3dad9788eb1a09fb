"""RRef proxies, as the peer's (torch/distributed/rpc/rref_proxy.py).

    rref.rpc_sync().forward(x)      # runs value.forward(x) on the owner
    rref.rpc_async().forward(x)     # a torch.futures.Future of it
    rref.remote().forward(x)        # an RRef of it, kept on the owner

A proxy call is a call of ``invoke`` on the RRef's owner with the RRef, the
method's name and the arguments (wire values, as for any call). ``invoke``
is one of tether's internal functions (_callee.INTERNAL, docs/security.md):
the owner runs it for any peer, and it calls only a public method or
``__call__`` of the object the RRef holds there.
"""
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


def created(rref):
    """On the owner: returns once the RRef's value exists (raising its
    creation error, if remote() failed)."""
    rref.local_value()


def creation_future(rref, timeout=UNSET_RPC_TIMEOUT):
    """``rref._get_future()``: a torch.futures.Future that completes (with
    None) once the owner has created the value, or with the creation's
    error. One call to the owner, which waits there."""
    import tether.rpc as rpc
    return rpc.rpc_async(rref.owner(), created, args=(rref,), timeout=timeout)


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
            return getattr(rpc, api)(rref.owner(), invoke,
                                     args=(rref, func_name, args, kwargs),
                                     timeout=timeout)

        call.__name__ = func_name
        return call

    def __repr__(self):
        return "RRefProxy(%r, %s)" % (self.rref, self.rpc_api)
