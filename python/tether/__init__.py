"""tether for Python: torch.distributed.rpc's API over tether's C++ core.

    import tether.rpc as rpc            # was: import torch.distributed.rpc as rpc

See docs/python.md for what works and docs/security.md for what a worker
runs for its peers (functions travel by reference, never pickled).
"""
import torch  # noqa: F401  (LibTorch's Python bindings, before tether._C)

from tether import _C  # noqa: F401
