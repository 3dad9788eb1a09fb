"""The future rpc_async returns: a torch.futures.Future whose wait() waits
for the answer on the calling thread.

Any thread may complete it: tether's completer thread when the answer
comes while nobody waits (then `then` and `add_done_callback` callbacks run
there, as before), or the thread in wait(), which reads the answer off the
socket itself when it sent the request (the assist, docs/architecture.md)
and then turns it into Python objects and completes the future, without
handing it to another thread and waking it.
"""
import torch


class RpcFuture(torch.futures.Future):
    """A torch.futures.Future of an rpc_async call (made by tether._C)."""

    def __init__(self, completion):
        super().__init__()
        self._completion = completion

    def wait(self):
        self._completion.help()
        return super().wait()
