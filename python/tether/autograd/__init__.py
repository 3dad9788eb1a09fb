"""tether.autograd: torch.distributed.autograd's API on tether
(docs/python.md, docs/autograd.md).

    import tether.autograd as dist_autograd   # was: torch.distributed.autograd

    with dist_autograd.context() as context_id:
        loss = rpc.rpc_sync("worker1", torch.add, args=(t1, t2)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)   # {t1: ..., t2: ...}

While a context is current on a thread, every call that thread makes
(rpc_sync, rpc_async, remote, to_here, RRef proxies) belongs to it, and so
do the calls the callee makes while serving it, Python functions included.
Tensors that require grad record their crossing, so backward() runs across
every worker they passed through, and each worker keeps the gradients of
its own leaf tensors in the context (never in ``.grad``).
"""
import threading

from tether import _C

__all__ = ["backward", "context", "get_gradients", "is_available"]


def is_available():
    return True


class context(object):
    """A distributed autograd context: ``with context() as context_id:``.

    Entering makes it current on this thread (contexts do not nest: a
    second one on the same thread is a RuntimeError); leaving releases it on
    every worker that took part."""

    def __enter__(self):
        self.autograd_context = _C.autograd_enter()
        return self.autograd_context.id

    def __exit__(self, type, value, traceback):
        self.autograd_context.release()


def backward(context_id, roots, retain_graph=False):
    """Runs the backward pass of ``context_id`` from ``roots`` (tensors that
    require grad; scalars, as the peer wants) across every worker the
    forward pass crossed, and returns when it is done everywhere. Without
    ``retain_graph`` the graph's saved tensors are freed, so a second
    backward through it raises, as in LibTorch."""
    # "incompatible function arguments": the peer's text (its binding's).
    if not isinstance(context_id, int) or isinstance(context_id, bool):
        raise TypeError("backward(): incompatible function arguments: "
                        "context_id must be an int, got %r" % (context_id,))
    if not isinstance(roots, (list, tuple)):
        raise TypeError("backward(): incompatible function arguments: roots "
                        "must be a list of tensors, got %s"
                        % type(roots).__qualname__)
    _C.autograd_backward(context_id, list(roots), bool(retain_graph))


def get_gradients(context_id):
    """The gradients ``context_id`` accumulated on this worker: a dict from
    each of this worker's leaf tensors (the caller's own tensor objects) to
    its gradient."""
    if not isinstance(context_id, int) or isinstance(context_id, bool):
        raise TypeError("context_id must be an int, got %r" % (context_id,))
    return _C.autograd_get_gradients(context_id)


class _Context:
    """A context as the peer's _current_context() and _retrieve_context()
    return it: its id, the workers it exchanged messages with from this
    worker, and its graph's send and recv functions on this worker."""

    def __init__(self, context_id):
        self._id = context_id

    def _context_id(self):
        return self._id

    def _known_worker_ids(self):
        """The ranks this context's messages reached from this worker, as a
        set (RuntimeError once the context is released here)."""
        return set(_C.autograd_context_peers(self._id))

    def _send_functions(self):
        """{autograd message id: send function}: one per message this
        worker sent in the context with tensors that require grad; its
        next_functions are those tensors' (name()
        "torch::distributed::autograd::SendRpcBackward", as the peer's)."""
        return _C.autograd_context_nodes(self._id)[0]

    def _recv_functions(self):
        """{autograd message id: recv function}: the grad_fn of the tensors
        each such message brought here ("...::RecvRpcBackward")."""
        return _C.autograd_context_nodes(self._id)[1]

    def __repr__(self):
        return "<distributed autograd context %d>" % self._id


def _current_context():
    """The context current on this thread (RuntimeError if none), as the
    peer's: ``_current_context()._context_id()``."""
    return _Context(_C.autograd_current_context())


def _get_debug_info():
    """The peer's dist_autograd._get_debug_info(): num_autograd_contexts
    (the contexts this worker holds, its own and those it took part in) and
    num_current_backward_passes (the contexts with a backward pass running
    on it), as text."""
    return _C.autograd_debug_info()


_by_hand = {}  # context id -> handle of a context _new_context() made
_by_hand_lock = threading.Lock()


def _new_context():
    """Enters a new context on this thread without a ``with`` block, as the
    peer's _new_context(); _release_context(id) releases it."""
    handle = _C.autograd_enter()
    with _by_hand_lock:
        _by_hand[handle.id] = handle
    return _Context(handle.id)


def _release_context(context_id):
    """Releases a context _new_context() made, from any thread, on every
    worker that took part (the peer's _release_context). RuntimeError with
    the peer's text for a context this worker does not hold; a context of a
    ``with`` block is released by its block."""
    with _by_hand_lock:
        handle = _by_hand.pop(context_id, None)
    if handle is None:
        _C.autograd_context_peers(context_id)  # the peer's text if unknown
        raise RuntimeError(
            "distributed autograd context %d was not made by _new_context(): "
            "its with block releases it" % context_id)
    handle.release()


def _get_max_id():
    """The largest context id this worker can make: its rank in the top 16
    bits, a 48-bit counter below, as the peer's."""
    return _C.autograd_max_context_id()


def _retrieve_context(context_id):
    """The context ``context_id`` as this worker holds it: one it made or
    took part in. RuntimeError with the peer's text ("Could not find
    autograd context with id: N") once it is released here, or if it never
    reached this worker."""
    _C.autograd_context_peers(context_id)
    return _Context(context_id)
