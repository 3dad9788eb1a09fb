"""A worker that serves calls until the caller shuts the group down.

    python3 callee.py INIT_METHOD [ALLOWED_MODULE ...]

It joins as "callee", rank 1 of 2. Its __main__ imports os (so a peer may
try "__main__:os.system") and defines main_add and Helper. It trusts only
its __main__ and the modules named, not the test modules beside it
(program_modules=False), so that what they define stays a module peers may
not call.
"""
import os  # noqa: F401  (reachable by attribute from __main__: must not run)
import sys

import torch  # noqa: F401
import tether.rpc as rpc

import exposed_functions  # noqa: F401  (registers its @rpc.expose function)


def main_add(a, b):
    return a + b


class Helper:
    def __init__(self, value):
        self.value = value


if __name__ == "__main__":
    options = rpc.RpcBackendOptions(init_method=sys.argv[1],
                                    allowed_modules=sys.argv[2:],
                                    program_modules=False)
    rpc.init_rpc("callee", rank=1, world_size=2, rpc_backend_options=options)
    rpc.shutdown()
