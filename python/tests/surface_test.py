"""tether.rpc's module surface as the peer's test suites and Paddle's
programs use it (docs/peer_suite.md): shutdown(timeout=), _set_rpc_timeout
and the peer's timeout text, worker infos, torch.device, dtype, layout and memory format values, sparse
tensors, TorchScript
functions by reference, Paddle's init_rpc(master_endpoint=). Real worker
processes on loopback."""
import os
import re

import pytest
import torch

import tether.rpc as rpc
import rpc_functions
import workers
from rpc_test import callee  # noqa: F401  (the module's caller/callee pair)


def test_set_rpc_timeout_bounds_later_calls_with_the_peers_error(callee):
    assert rpc.get_rpc_timeout() == 60.0
    rpc._set_rpc_timeout(0.2)
    try:
        assert rpc.get_rpc_timeout() == pytest.approx(0.2)
        with pytest.raises(RuntimeError) as raised:
            rpc.rpc_sync(callee, rpc_functions.slow, args=(3,))
        # The peer's text (its suites match "RPC ran for more than"), and
        # Python's TimeoutError for new code.
        assert isinstance(raised.value, TimeoutError)
        assert isinstance(raised.value, rpc.RpcTimeoutError)
        assert str(raised.value).startswith(
            "RPC ran for more than set timeout (200 ms)"), str(raised.value)
        # A call's own timeout still wins over the default.
        assert rpc.rpc_sync(callee, rpc_functions.slow, args=(0.5,),
                            timeout=10) == 0.5
        fut = rpc.rpc_async(callee, rpc_functions.slow, args=(3,))
        with pytest.raises(RuntimeError, match="RPC ran for more than"):
            fut.wait()
    finally:
        rpc._set_rpc_timeout(60.0)
    assert rpc.get_rpc_timeout() == 60.0
    with pytest.raises(ValueError, match="rpc_timeout must be >= 0"):
        rpc._set_rpc_timeout(-1)


def test_worker_infos_compare_and_hash_by_name_and_id(callee):
    me = rpc.get_worker_info()
    assert me == rpc.get_current_worker_info() == rpc.get_worker_info(
        "caller")
    other = rpc.get_worker_info(callee)
    assert other == rpc.get_worker_info(1)  # by rank, as `to` may be
    assert other != me and other != ("callee", 1)
    assert {me, other, rpc.get_worker_info(callee)} == {me, other}
    assert {other: "x"}[rpc.WorkerInfo("callee", 1)] == "x"
    assert (other.rank, other.id, other.name) == (1, 1, "callee")
    assert set(rpc.get_all_worker_infos()) == {me, other}
    # A WorkerInfo names the destination as its name does.
    assert rpc.rpc_sync(other, rpc_functions.whoami) == "callee"


def test_devices_and_sizes_travel(callee):
    device = rpc.rpc_sync(callee, rpc_functions.echo,
                          args=(torch.device("cpu"),))
    assert isinstance(device, torch.device) and device == torch.device("cpu")
    size = rpc.rpc_sync(callee, rpc_functions.echo,
                        args=(torch.ones(2, 3).size(),))
    assert tuple(size) == (2, 3)
    ones = rpc.rpc_sync(callee, torch.ones, args=([2],),
                        kwargs={"device": torch.device("cpu")})
    assert torch.equal(ones, torch.ones(2))


def test_views_keep_their_strides_unless_wasteful(callee):
    # The peer's test_non_cont_tensors: a view of a small storage comes back
    # the same view (core/wire/codec.h, "Views"); a small view of a large
    # storage comes back as a compact copy.
    view = torch.rand(5, 5).narrow(1, 2, 2)
    back = rpc.rpc_sync(callee, rpc_functions.echo, args=(view,))
    assert not back.is_contiguous()
    assert back.stride() == view.stride()
    assert back.storage_offset() == 2
    assert torch.equal(back, view)
    corner = torch.rand(64, 64).narrow(1, 0, 2)
    back = rpc.rpc_sync(callee, rpc_functions.echo, args=(corner,))
    assert back.is_contiguous() and back.storage_offset() == 0
    assert torch.equal(back, corner)


def test_dtypes_layouts_and_memory_formats_travel_as_themselves(callee):
    for value in (torch.float32, torch.int64, torch.bool, torch.complex64,
                  torch.strided, torch.sparse_coo, torch.channels_last,
                  torch.contiguous_format):
        back = rpc.rpc_sync(callee, rpc_functions.echo, args=(value,))
        assert back is value, (value, back)
    # As arguments LibTorch operators take.
    zeros = rpc.rpc_sync(callee, torch.zeros, args=([2],),
                         kwargs={"dtype": torch.float64})
    assert zeros.dtype == torch.float64
    with pytest.raises((TypeError, ValueError, RuntimeError),
                       match="unsupported value"):
        rpc.rpc_sync(callee, rpc_functions.echo, args=(torch.qint8,))


def test_sparse_tensors_travel_as_sparse(callee):
    i = torch.tensor([[0, 2, 0], [1, 0, 1]])
    loose = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0, 3.0]), (3, 2))
    for t in (loose, loose.coalesce(),
              torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1, 4),
                                      (2, 4))):
        back = rpc.rpc_sync(callee, rpc_functions.echo, args=(t,))
        assert back.is_sparse and back.is_coalesced() == t.is_coalesced()
        assert torch.equal(back.to_dense(), t.to_dense())
    total = rpc.rpc_sync(callee, torch.add, args=(loose, loose))
    assert torch.equal(total.to_dense(), 2 * loose.to_dense())


@torch.jit.script
def script_twice(a: torch.Tensor) -> torch.Tensor:
    return a * 2


def test_torchscript_functions_are_called_by_reference(callee):
    t = torch.arange(3.0)
    assert torch.equal(
        rpc.rpc_sync(callee, rpc_functions.script_add, args=(t, t)), t + t)
    fut = rpc.rpc_async(callee, rpc_functions.script_add, args=(t, 1.0 + t))
    assert torch.equal(fut.wait(), 2 * t + 1)
    rref = rpc.remote(callee, rpc_functions.script_add, args=(t, t))
    assert torch.equal(rref.to_here(), t + t)
    # This test module is not allowed on the callee: no code travels, so
    # the callee cannot run a scripted function it does not have.
    with pytest.raises(RuntimeError, match="refused to run.*script_twice"):
        rpc.rpc_sync(callee, script_twice, args=(t,))


def test_torchscript_functions_take_and_read_rrefs(callee):
    t = torch.arange(3.0)
    mine = rpc.RRef(t)  # the callee fetches it from here
    assert torch.equal(
        rpc.rpc_sync(callee, rpc_functions.script_read_rref, args=(mine, t)),
        2 * t)
    assert torch.equal(
        rpc.rpc_sync(callee, rpc_functions.script_read_rref,
                     kwargs={"t": t, "r": mine}), 2 * t)
    assert torch.equal(
        rpc.rpc_sync(callee, rpc_functions.script_read_twice, args=(mine,)),
        4 * t)
    assert rpc.rpc_sync(callee, rpc_functions.script_about_rref,
                        args=(mine,)) == ("caller", False, True)
    assert torch.equal(
        rpc.rpc_sync(callee, rpc_functions.script_read_all,
                     args=([mine, rpc.RRef(t + 1)],)), 2 * t + 1)
    back = rpc.rpc_sync(callee, rpc_functions.script_rref_back, args=(mine,))
    assert isinstance(back, rpc.RRef) and back.is_owner()
    assert torch.equal(back.local_value(), t)
    theirs = rpc.remote(callee, torch.add, args=(t, 1))
    assert torch.equal(
        rpc.rpc_sync(callee, rpc_functions.script_local_value,
                     args=(theirs,)), 2 * (t + 1))
    assert rpc.rpc_sync(callee, rpc_functions.script_about_rref,
                        args=(theirs,)) == ("callee", True, True)
    # What does not fit fails the call, naming it.
    with pytest.raises(RuntimeError, match="callee.*local_value|owner"):
        rpc.rpc_sync(callee, rpc_functions.script_local_value, args=(mine,))
    with pytest.raises(RuntimeError,
                       match=r"gave a int where the function declares "
                             r"RRef\[Tensor\]"):
        rpc.rpc_sync(callee, rpc_functions.script_read_rref,
                     args=(rpc.RRef(7), t))
    with pytest.raises(RuntimeError, match="declared RRef"):
        rpc.rpc_sync(callee, rpc_functions.script_read_rref, args=(t, t))


def test_shutdown_timeout_bounds_the_graceful_wait():
    program = os.path.join(workers.HERE, "shutdown_timeout.py")
    (rc0, out0), (rc1, out1) = workers.run_group(
        program, 2, "tensorpipe", args_for_rank=lambda rank: [str(rank)])
    assert rc0 == 0 and rc1 == 0, out0 + out1
    assert "shutdown raised" in out0 and "join timed out" in out0, out0
    assert "call after shutdown raised" in out0, out0
    assert "rank 1 done" in out1, out1


@pytest.mark.parametrize("backend", workers.BACKENDS)
def test_paddle_program(backend):
    program = os.path.join(workers.HERE, "paddle_style.py")
    port = workers.free_port()
    results = workers.run_group(
        program, 2, backend, args_for_rank=lambda rank: [str(rank), str(port)],
        # Paddle's programs set no MASTER_ADDR/PORT: master_endpoint says it.
        extra_env={"MASTER_ADDR": "", "MASTER_PORT": ""})
    for rc, out in results:
        assert rc == 0, out
    (_, out0), (_, out1) = results
    assert "me worker0 rank 0" in out0 and "me worker1 rank 1" in out1
    assert "all [('worker0', 0), ('worker1', 1)]" in out0, out0
    assert "sum [3.0, 3.0]" in out0, out0
    # WorkerInfo.ip/.port: from the address each backend published (on
    # libfabric, tcp;ofi_rxm's endpoint name, a sockaddr).
    endpoints = [re.search(r"^endpoint (\S+) (\S+)$", out, re.M).groups()
                 for out in (out0, out1)]
    (ip0, port0), (ip1, port1) = endpoints
    assert ip0 == ip1 == "127.0.0.1", out0 + out1
    assert int(port0) > 0 and int(port1) > 0 and port0 != port1
    # Every worker sees the same endpoints, its own included.
    seen = "endpoints [('worker0', '127.0.0.1', %s), ('worker1', '127.0.0.1', " \
        "%s)]" % (port0, port1)
    assert seen in out0 and seen in out1, out0 + out1
    assert "worker1's port is taken: True" in out0, out0
    # Read while the group was up, kept after shutdown.
    assert "after shutdown 127.0.0.1 %s" % port0 in out0, out0


def test_paddle_master_endpoint_must_be_ip_port():
    with pytest.raises(ValueError, match="master_endpoint must be 'ip:port'"):
        rpc.init_rpc("w", rank=0, world_size=1, master_endpoint="nowhere")


def test_a_callback_may_wait_for_another_call(callee):
    # The peer's test_callback_with_ret: the inner call completes while the
    # outer callback waits for it.
    def callback(outer):
        inner = rpc.rpc_async(callee, torch.add, args=(outer.wait(), 1))
        return inner.then(lambda f: f.wait() + 1).wait()

    fut = rpc.rpc_async(callee, torch.add,
                        args=(torch.ones(2), 1)).then(callback)
    assert torch.equal(fut.wait(), torch.full((2,), 4.0))


def test_async_execution_returns_the_futures_value(callee):
    t = torch.ones(2)
    assert torch.equal(rpc.rpc_sync(callee, rpc_functions.async_add,
                                    args=("caller", t, 2)), t + 2)
    assert torch.equal(rpc.rpc_async(callee, rpc_functions.async_add,
                                     args=("caller", t, 3)).wait(), t + 3)
    assert torch.equal(rpc.remote(callee, rpc_functions.async_add,
                                  args=("caller", t, 4)).to_here(), t + 4)
    with pytest.raises(RuntimeError, match="must return a torch.futures"):
        rpc.rpc_sync(callee, rpc_functions.async_not_a_future)


def test_class_methods_and_bound_methods_run(callee):
    assert rpc.rpc_sync(callee, rpc_functions.Accumulator.start_at,
                        args=(5,)) == 5
    # The object travels by value: the callee adds to its copy.
    mine = rpc_functions.Accumulator(1)
    assert rpc.rpc_sync(callee, mine.add, args=(2,)) == 3
    assert mine.total == 1


def test_namedtuples_arrive_as_themselves_not_as_tuples(callee):
    import collections
    back = rpc.rpc_sync(callee, rpc_functions.echo,
                        args=(rpc_functions.Pair(1, torch.ones(1)),))
    assert type(back) is rpc_functions.Pair and back.a == 1
    # One defined in a function has no name the callee could find.
    Local = collections.namedtuple("Local", "a b")
    with pytest.raises(TypeError, match="argument 1 of .* is a .*Local and "
                       "it cannot be pickled"):
        rpc.rpc_sync(callee, rpc_functions.echo, args=(Local(1, 2),))
    with pytest.raises(ValueError, match="got the float 1.5"):
        rpc.rpc_sync(1.5, rpc_functions.echo, args=(1,))


def test_options_and_names_are_checked_with_the_peers_words():
    import datetime
    with pytest.raises(TypeError, match="incompatible constructor arguments: "
                       "rpc_timeout must be a number of seconds"):
        rpc.RpcBackendOptions(rpc_timeout=datetime.timedelta(seconds=1))
    with pytest.raises(TypeError, match="rpc_backend_options must be an "
                       "instance of RpcBackendOptions"):
        rpc.init_rpc("w", rank=0, world_size=1,
                     rpc_backend_options={"init_method": "env://"})
    with pytest.raises(RuntimeError, match="Worker name must match"):
        rpc.WorkerInfo("abc*", 0)
    with pytest.raises(RuntimeError, match="must be non-empty"):
        rpc.WorkerInfo("", 0)
    with pytest.raises(RuntimeError, match="shorter than 128"):
        rpc.WorkerInfo("a" * 500, 0)


def test_the_peers_collectives_gather_from_every_worker(callee):
    # The peer's rpc.api._all_gather, _barrier and _wait_all_workers (its
    # programs and suites call them), over tether's Worker::all_gather.
    theirs = rpc.rpc_async(callee, rpc_functions.all_gather,
                           args=(torch.ones(2),))
    mine = rpc._all_gather(torch.zeros(2))
    assert set(mine) == {"caller", "callee"}
    assert torch.equal(mine["caller"], torch.zeros(2))
    assert torch.equal(mine["callee"], torch.ones(2))
    assert set(theirs.wait()) == {"caller", "callee"}
    # A set of this worker alone gathers at once; one without it is refused.
    assert rpc._all_gather(7, ["caller"]) == {"caller": 7}
    rpc._barrier(["caller"])
    with pytest.raises(RuntimeError, match="caller"):
        rpc._all_gather(7, ["callee"])
    with pytest.raises(RuntimeError, match="builtins.object is not allowed"):
        rpc._all_gather(object(), ["caller"])
    # What the peer's programs read of its agent object.
    agent = rpc._get_current_rpc_agent()
    assert {i.name for i in agent.get_worker_infos()} == {"caller", "callee"}
    assert agent.get_worker_info().name == "caller"


def test_wait_all_waits_for_the_futures_of_its_block(callee):
    # The peer's rpc.api._wait_all: the futures rpc_async returns on this
    # thread inside the block are waited for at its end.
    with rpc._wait_all():
        fut = rpc.rpc_async(callee, rpc_functions.slow, args=(0.3,))
        assert rpc._thread_local_var.future_list == [fut]
    assert fut.done() and fut.value() == 0.3
    assert not hasattr(rpc._thread_local_var, "future_list")
    with pytest.raises(ValueError, match="boom"):
        with rpc._wait_all():
            rpc.rpc_async(callee, rpc_functions.fail, args=("boom",))
    assert not hasattr(rpc._thread_local_var, "future_list")


def _large_tensor_offset(thp_value):
    """In a fresh interpreter with THP_MEM_ALLOC_ENABLE=`thp_value` (None:
    unset): a 4 MiB tensor's offset from a 2 MiB boundary, and what
    init_rpc raised (or 'ok')."""
    program = (
        "import torch, tether.rpc as rpc\n"
        "t = torch.ones(4 << 20, dtype=torch.uint8)\n"
        "print('offset', t.data_ptr() % (2 << 20), int(t.sum()))\n"
        "try:\n"
        "    rpc.init_rpc('w', rank=0, world_size=1)\n"
        "    rpc.shutdown()\n"
        "    print('init ok')\n"
        "except Exception as e:\n"
        "    print('init raised', type(e).__name__, e)\n")
    env = workers.group_env(0, 1, workers.free_port(), "tensorpipe")
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    if thp_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = thp_value
    proc = workers.spawn(["-c", program], env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def test_thp_mem_alloc_enable_puts_large_tensors_on_huge_pages():
    # As PyTorch 2.1 and later read it (core/huge_pages.h): from import
    # tether on, tensors of 2 MiB and more are aligned to a huge page.
    out = _large_tensor_offset("1")
    assert "offset 0 4194304" in out, out
    assert "init ok" in out, out
    # Off by default, and with 0: LibTorch's own allocation.
    for value in (None, "0"):
        out = _large_tensor_offset(value)
        assert re.search(r"offset [1-9]\d* 4194304", out), out
        assert "init ok" in out, out
    # A value that is not an integer: init_rpc says what was wrong.
    out = _large_tensor_offset("yes")
    assert "init raised" in out and "THP_MEM_ALLOC_ENABLE must be an " \
        "integer" in out and "'yes'" in out, out


def test_an_empty_backend_variable_is_unset(monkeypatch):
    monkeypatch.setenv("TETHER_BACKEND", "")
    assert rpc._backend_name(None) == "tensorpipe"
    monkeypatch.setenv("TETHER_BACKEND", "grpc")
    assert rpc._backend_name(None) == "grpc"
