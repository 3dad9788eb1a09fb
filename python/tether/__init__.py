"""tether for Python: torch.distributed.rpc's API over tether's C++ core.

    import tether.rpc as rpc            # was: import torch.distributed.rpc as rpc

See docs/python.md for what works and docs/security.md for what a worker
runs for its peers (functions travel by reference, never pickled).
"""
import re

import torch  # LibTorch's Python bindings, before tether._C

try:
    from tether import _build
except ImportError as e:
    raise ImportError(
        "tether/_build.py is missing beside %s: Bazel writes it with the "
        "extension (a checkout: scripts/python_setup.sh; docs/python.md, "
        "Installing)" % __file__) from e


def _check_torch():
    """The extension links the LibTorch of one release: another torch would
    fail to load it with a missing symbol, or worse, load it."""
    running = re.match(r"\d+\.\d+\.\d+", torch.__version__)
    if running is None or running.group(0) != _build.TORCH_VERSION:
        raise ImportError(
            "tether %s was built against torch %s, but this Python imports "
            "torch %s (%s): install torch %s (Debian's python3-torch) or "
            "build tether against this torch (docs/python.md, Installing)"
            % (_build.VERSION, _build.TORCH_VERSION, torch.__version__,
               getattr(torch, "__file__", "?"), _build.TORCH_VERSION))


_check_torch()

from tether import _C  # noqa: E402,F401

__version__ = _build.VERSION
