"""The peer's RPC test suites, pointed at tether (docs/peer_suite.md).

Importing this module installs tether under the peer's module names
(peer_modules.install) and then imports the peer's test files from Debian's
python3-torch, unchanged. Each suite is mixed, as the peer's own
torch/testing/_internal/distributed/rpc_utils.py does, with a fixture
(TetherFixture: backend, options, rendezvous, the error texts the tests
match) and MultiProcessTestCase, which runs each test method in
`world_size` fresh worker processes. The classes are module-level names of
this module so the workers find them:

    /usr/bin/python3 -m unittest peer_suite.suites.TetherRpcTest.test_self_add

TETHER_BACKEND picks the backend (tensorpipe, grpc, libfabric; default
tensorpipe). TETHER_PEER_SUITE_START=spawn makes the workers fresh
interpreters as the peer's harness does; the default, fork, starts them
from this process after the imports, which is several times faster on a
small machine and runs the same test code.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import expecttest  # noqa: F401  (torch's common_utils needs it)
except ImportError:
    sys.path.append(os.path.join(_HERE, "compat"))

from peer_suite import peer_modules  # noqa: E402

peer_modules.install()

import torch  # noqa: E402
import tether.rpc  # noqa: E402
from torch.testing._internal.common_distributed import (  # noqa: E402
    MultiProcessTestCase,
)
from torch.testing._internal.distributed.rpc.rpc_agent_test_fixture import (  # noqa: E402,E501
    RpcAgentTestFixture,
)

with peer_modules.scripting_kept_importable():
    from torch.testing._internal.distributed.rpc import (
        dist_autograd_test,
        dist_optimizer_test,
        rpc_test,
    )
    from torch.testing._internal.distributed.rpc.examples import (
        parameter_server_test,
        reinforcement_learning_rpc_test,
    )

# The peer's test files define the functions and classes the tests call
# remotely; a worker lets its peers run those (and nothing else of theirs),
# and build torch.nn's modules (test_embedding_bag_with_no_grad_tensors
# makes a torch.nn.EmbeddingBag on a peer), as a program that does so
# allows them (docs/security.md).
ALLOWED_MODULES = ["torch.testing._internal.distributed.rpc",
                   "torch.testing._internal.dist_utils", "torch.nn.modules"]


class TetherFixture(RpcAgentTestFixture):
    """The peer's RpcAgentTestFixture for tether: init_method is the peer's
    (a file:// store per test, or tcp:// with RPC_INIT_WITH_TCP=1)."""

    @property
    def rpc_backend(self):
        return tether.rpc.BackendType(
            os.environ.get("TETHER_BACKEND", "tensorpipe"))

    @property
    def rpc_backend_options(self):
        return tether.rpc.RpcBackendOptions(
            init_method=self.init_method, allowed_modules=ALLOWED_MODULES)

    def get_shutdown_error_regex(self):
        # As the peer's TensorPipe fixture: the shutdown race has no one
        # text on any agent.
        return ".*"

    def get_timeout_error_regex(self):
        return "RPC ran for more than"


class WorkerProcesses(MultiProcessTestCase):
    """rpc_utils.SpawnHelper, with the start method chosen as above."""

    def setUp(self):
        super().setUp()
        if os.environ.get("TETHER_PEER_SUITE_START", "fork") == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(
                torch.multiprocessing.get_context("fork").Process)


# The suites the peer runs on its TensorPipe agent (rpc_utils.GENERIC_TESTS
# and TENSORPIPE_TESTS) of its RPC, distributed autograd and optimizer
# files. The Jit*, RemoteModule and DDP suites are not run
# (docs/peer_suite.md).
SUITES = {
    "RpcTest": rpc_test.RpcTest,
    "TensorPipeAgentRpcTest": rpc_test.TensorPipeAgentRpcTest,
    "DistAutogradTest": dist_autograd_test.DistAutogradTest,
    "TensorPipeAgentDistAutogradTest":
        dist_autograd_test.TensorPipeAgentDistAutogradTest,
    "DistOptimizerTest": dist_optimizer_test.DistOptimizerTest,
    "ParameterServerTest": parameter_server_test.ParameterServerTest,
    "ReinforcementLearningRpcTest":
        reinforcement_learning_rpc_test.ReinforcementLearningRpcTest,
}

for _name, _suite in SUITES.items():
    _class = type("Tether" + _name, (_suite, TetherFixture, WorkerProcesses),
                  {})
    _class.__module__ = __name__
    globals()["Tether" + _name] = _class
