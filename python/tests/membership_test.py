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
    # w1 starts once w0's group runs: else w1 may found the group, and
    # w0 join it.
    first = workers.spawn([PROGRAM, "w0", "0"], envs[0])
    started = workers.read_until(first, "group at start")
    joiner = workers.spawn([PROGRAM, "w1", "1"], envs[1])
    (rc0, out0), (rc1, out1) = workers.finish([first, joiner])
    out0 = started + out0
    assert rc0 == 0 and rc1 == 0, out0 + out1
    assert "group at join ['w0', 'w1']" in out1, out1
    assert "sum [2.0, 2.0]" in out1, out1
    assert "called w1: w1" in out0, out0
    assert "after leave:" in out0 and "has left the group" in out0, out0



@pytest.mark.parametrize("init_method,why", [
    ("file:///nonexistent/rdzv", "file:// rendezvous: rank parameter missing"),
    ("tcp://127.0.0.1:1", "tcp:// rendezvous: rank parameter missing"),
    ("env://", "env:// rendezvous: environment variable RANK expected, "
               "but not set"),
])
def test_a_dynamic_worker_without_a_rank_is_a_value_error(
        monkeypatch, init_method, why):
    # The peer's ValueError and text (its test_dynamic_rpc_init_rpc_without
    # _rank), then tether's; refused before any rendezvous is tried.
    import tether.rpc as rpc
    for key in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "WORLD_SIZE",
                "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    options = rpc.RpcBackendOptions(init_method=init_method)
    with pytest.raises(ValueError) as error:
        rpc.init_rpc("w", rpc_backend_options=options)
    assert str(error.value).startswith(
        "Error initializing torch.distributed using " + why), error.value
    assert "needs its rank" in str(error.value), error.value
    assert not rpc._C.is_initialized()
