"""A dynamic group from Python (docs/reliability.md, "Groups that change"):
init_rpc with no world size anywhere joins a running group, shutdown leaves
it, on every backend. Real processes on loopback."""
import os

import pytest

import workers

PROGRAM = os.path.join(workers.HERE, "dynamic_group.py")


@pytest.mark.parametrize("backend", ["tensorpipe", "grpc", "libfabric"])
def test_a_worker_joins_and_leaves_a_running_group(backend):
    port = workers.free_port()
    envs = []
    for rank in (0, 1):
        env = workers.group_env(rank, 0, port, backend)
        for key in ("RANK", "WORLD_SIZE"):
            env.pop(key)
        envs.append(env)
    first = workers.spawn([PROGRAM, "w0", "0"], envs[0])
    joiner = workers.spawn([PROGRAM, "w1", "1"], envs[1])
    (rc0, out0), (rc1, out1) = workers.finish([first, joiner])
    assert rc0 == 0 and rc1 == 0, out0 + out1
    assert "group at join ['w0', 'w1']" in out1, out1
    assert "sum [2.0, 2.0]" in out1, out1
    assert "called w1: w1" in out0, out0
    assert "after leave:" in out0 and "has left the group" in out0, out0

