"""tether.rpc from Python, against real worker processes on loopback."""
import os
import re
import threading

import pytest
import torch
import torch.nn.functional as F

import tether.rpc as rpc
import rpc_functions
import workers

SEED = os.path.join(workers.REPO, "examples", "python", "rpc_async_seed.py")
CALLEE = os.path.join(workers.HERE, "callee.py")


def check_seed(results):
    for rc, out in results:
        assert rc == 0, out
    assert "torch.add + min: tensor([5., 5.])" in results[0][1], results[0][1]
    assert "my_add: tensor([2., 2.])" in results[0][1], results[0][1]


@pytest.mark.parametrize("backend", workers.BACKENDS)
def test_seed_program_runs_on_each_backend(backend):
    check_seed(workers.run_group(SEED, 2, backend,
                                 args_for_rank=lambda rank: [str(rank)]))


def test_seed_program_is_the_peers_but_for_the_import_line(tmp_path):
    source = open(SEED).read()
    assert source.count("import tether.rpc as rpc") == 1
    peer = tmp_path / "peer_seed.py"
    peer.write_text(source.replace("import tether.rpc as rpc",
                                   "import torch.distributed.rpc as rpc"))
    check_seed(workers.run_group(str(peer), 2, "tensorpipe",
                                 args_for_rank=lambda rank: [str(rank)]))


@pytest.fixture(scope="module")
def callee():
    """This process is "caller" (rank 0); callee.py is rank 1 and allows
    rpc_functions. The caller allows it too (for nested calls back), and
    busy-polls (RpcBackendOptions.busy_poll): every test below runs with
    the caller's waits polling for 200 us before they sleep."""
    port = workers.free_port()
    init = "tcp://127.0.0.1:%d" % port
    proc = workers.spawn([CALLEE, init, "rpc_functions"],
                         workers.group_env(1, 2, port, "tensorpipe"))
    rpc.init_rpc("caller", rank=0, world_size=2,
                 rpc_backend_options=rpc.RpcBackendOptions(
                     init_method=init, allowed_modules=["rpc_functions"],
                     busy_poll=0.0002))
    yield "callee"
    rpc.shutdown()
    [(rc, out)] = workers.finish([proc])
    assert rc == 0, out


def test_busy_poll_option_is_checked():
    assert rpc.RpcBackendOptions(busy_poll=1).busy_poll == 1.0
    with pytest.raises(ValueError, match="busy_poll must be 0 or more"):
        rpc.RpcBackendOptions(busy_poll=-0.5)
    with pytest.raises(TypeError, match="busy_poll"):
        rpc.RpcBackendOptions(busy_poll="fast")
    assert rpc.RpcBackendOptions().spare_core_poll == 100e-6
    assert rpc.RpcBackendOptions(spare_core_poll=0).spare_core_poll == 0.0
    with pytest.raises(ValueError, match="spare_core_poll must be 0 or more"):
        rpc.RpcBackendOptions(spare_core_poll=-1)


def test_worker_infos(callee):
    me = rpc.get_worker_info()
    assert (me.name, me.id) == ("caller", 0)
    other = rpc.get_worker_info(callee)
    assert (other.name, other.id) == ("callee", 1)
    assert repr(other) == "WorkerInfo(id=1, name=callee)"
    assert rpc.get_worker_info(callee) == other
    assert [w.name for w in rpc.get_all_worker_infos()] == ["caller", "callee"]
    assert rpc.get_rpc_timeout() == 60.0
    with pytest.raises(RuntimeError, match="unknown worker 'nobody'"):
        rpc.get_worker_info("nobody")


def test_torch_builtins_pick_the_overload_that_fits(callee):
    t = torch.ones(2)
    assert torch.equal(rpc.rpc_sync(callee, torch.add, args=(t, 3)),
                       torch.full((2,), 4.0))
    assert torch.equal(rpc.rpc_sync(callee, torch.add, args=(t, t),
                                    kwargs={"alpha": 2}),
                       torch.full((2,), 3.0))
    m = torch.arange(4.0).reshape(2, 2)
    assert torch.equal(rpc.rpc_sync(callee, torch.matmul, args=(m, m)), m @ m)
    assert torch.equal(rpc.rpc_sync(callee, F.relu, args=(t - 2,)),
                       torch.zeros(2))
    assert torch.equal(rpc.rpc_sync(callee, torch.cat, args=([t, t],)),
                       torch.ones(4))


def test_builtin_without_a_fitting_overload_lists_candidates(callee):
    with pytest.raises(RuntimeError) as error:
        rpc.rpc_sync(callee, torch.add, args=("text",))
    assert "no overload of aten::add fits the arguments (str)" in str(
        error.value)
    assert "aten::add.Tensor(Tensor self, Tensor other" in str(error.value)


def test_builtin_without_arguments_raises_the_peers_text_first(callee):
    # The peer's text, sic ("many"): its test_op_with_invalid_args matches it.
    with pytest.raises(RuntimeError) as error:
        rpc.rpc_sync(callee, torch.add, args=())
    assert ("Overloaded torch operator invoked from Python failed to many "
            "any schema: no overload of aten::add fits the arguments ()"
            in str(error.value))


def test_harmless_builtins(callee):
    assert rpc.rpc_sync(callee, min, args=(1, 2)) == 1
    assert rpc.rpc_sync(callee, max, args=([3, 9, 4],)) == 9
    assert rpc.rpc_sync(callee, sum, args=([1, 2, 3],)) == 6
    assert rpc.rpc_sync(callee, len, args=("four",)) == 4
    assert rpc.rpc_sync(callee, abs, args=(-2.5,)) == 2.5


def test_user_functions_and_values_round_trip(callee):
    assert rpc.rpc_sync(callee, rpc_functions.add, args=(1, 2)) == 3
    value = {"t": torch.arange(3), "xs": [1, 2], "nested": (None, "s", 1.5,
                                                            [torch.ones(1)]),
             "flags": [True, False], "empty": []}
    back = rpc.rpc_sync(callee, rpc_functions.echo, args=(value,))
    assert back.keys() == value.keys()
    assert torch.equal(back["t"], value["t"])
    assert back["xs"] == [1, 2] and back["flags"] == [True, False]
    assert back["nested"][:3] == (None, "s", 1.5)
    assert torch.equal(back["nested"][3][0], torch.ones(1))
    assert back["empty"] == []
    assert rpc.rpc_sync(callee, "py::__main__:main_add", args=(2, 3)) == 5
    assert rpc.rpc_sync(callee, rpc_functions.whoami) == "callee"


def test_numpy_arrays_travel_as_numpy_arrays(callee):
    import numpy as np
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    back = rpc.rpc_sync(callee, rpc_functions.echo, args=(a,))
    assert isinstance(back, np.ndarray) and back.dtype == np.float32
    assert np.array_equal(back, a)
    doubled = rpc.rpc_sync(callee, rpc_functions.add, args=(a, a))
    assert np.array_equal(doubled, 2 * a)
    for value in [np.float64(1.5), np.int32(7), np.dtype("int16"),
                  np.array([[1, 2]], dtype=np.int64).T,
                  np.array(["a", "bc"]), np.zeros((0, 3))]:
        back = rpc.rpc_sync(callee, rpc_functions.echo, args=(value,))
        assert type(back) is type(value) and np.array_equal(back, value)


def test_objects_travel_by_value_with_their_tensors_and_rrefs(callee):
    import collections
    t = torch.arange(4.0)
    point = rpc.rpc_sync(callee, rpc_functions.shift,
                         args=(rpc_functions.Point(1, "y", t), 10))
    assert isinstance(point, rpc_functions.Point)
    assert (point.x, point.y) == (11, "y") and torch.equal(point.t, 2 * t)
    # An RRef inside an object is forked, as at top level: the callee
    # fetches it from here.
    held = rpc_functions.Point(0, 0, rpc.RRef(t + 1))
    assert torch.equal(rpc.rpc_sync(callee, rpc_functions.fetch_held,
                                    args=(held,)), t + 1)
    for value in [{1, 2}, frozenset({"a"}), slice(1, 5, 2), 2 + 3j,
                  collections.OrderedDict(b=1, a=torch.ones(1)),
                  [rpc_functions.Point(1, 2, None)]]:
        back = rpc.rpc_sync(callee, rpc_functions.echo, args=(value,))
        assert type(back) is type(value)
    # A remote() result that is a Python object, fetched by value.
    rref = rpc.remote(callee, rpc_functions.Point, args=(1, 2, t))
    fetched = rref.to_here()
    assert isinstance(fetched, rpc_functions.Point)
    assert torch.equal(fetched.t, t)


def test_modules_are_returned_by_value(callee):
    linear = rpc.rpc_sync(callee, rpc_functions.make_linear, args=(3,))
    torch.manual_seed(3)
    local = torch.nn.Linear(3, 2)
    assert isinstance(linear, torch.nn.Linear)
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad
               for p in linear.parameters())
    assert torch.equal(linear.weight, local.weight)
    x = torch.ones(1, 3)
    assert torch.equal(linear(x), local(x))


def test_results_are_unpickled_under_the_callers_policy(callee):
    # The caller allows no collections.Counter: refused here, naming it.
    with pytest.raises(RuntimeError, match=r"the global collections\.Counter "
                       r"is not allowed on this worker"):
        rpc.rpc_sync(callee, rpc_functions.make_counter)
    import collections
    rpc.add_safe_globals([collections.Counter])
    try:
        assert rpc.rpc_sync(callee, rpc_functions.make_counter) == \
            collections.Counter("aab")
    finally:
        rpc.clear_safe_globals()


def test_an_argument_pickle_refuses_names_it_at_the_caller(callee):
    with pytest.raises(TypeError, match=r"argument 1 of 'py::rpc_functions:"
                       r"echo'\[1\] is a _thread\.lock and it cannot be "
                       r"pickled"):
        rpc.rpc_sync(callee, rpc_functions.echo,
                     args=((1, threading.Lock()),))


def test_exposed_function_of_a_module_not_allowed(callee):
    import exposed_functions
    assert rpc.rpc_sync(callee, exposed_functions.exposed_double,
                        args=(21,)) == 42
    with pytest.raises(RuntimeError, match="module 'exposed_functions' is "
                                           "not allowed"):
        rpc.rpc_sync(callee, exposed_functions.not_exposed, args=(1,))


def test_remote_exception_keeps_its_type_worker_and_text(callee):
    with pytest.raises(ValueError) as error:
        rpc.rpc_sync(callee, rpc_functions.fail, args=("boom",))
    text = str(error.value)
    assert "Error on worker 1 (callee)" in text
    assert "ValueError: boom" in text
    assert "in fail" in text  # the remote traceback


def test_rpc_async_returns_a_torch_future(callee):
    fut = rpc.rpc_async(callee, torch.add, args=(torch.ones(2), 3))
    assert isinstance(fut, torch.futures.Future.__mro__[1])  # torch._C.Future
    assert torch.equal(fut.wait(), torch.full((2,), 4.0))
    assert fut.done()
    assert torch.equal(fut.value(), torch.full((2,), 4.0))
    chained = rpc.rpc_async(callee, min, args=(1, 2)).then(
        lambda f: f.wait() + 10)
    assert chained.wait() == 11
    seen = threading.Event()
    done = rpc.rpc_async(callee, rpc_functions.add, args=(1, 1))
    done.add_done_callback(lambda f: seen.set())
    assert done.wait() == 2
    assert seen.wait(30)
    futs = [rpc.rpc_async(callee, rpc_functions.add, args=(i, i))
            for i in range(20)]
    assert [f.wait() for f in torch.futures.wait_all(futs) and futs] == [
        2 * i for i in range(20)]
    assert torch.futures.wait_all(futs) == [2 * i for i in range(20)]
    collected = torch.futures.collect_all(futs).wait()
    assert [f.value() for f in collected] == [2 * i for i in range(20)]


def test_rpc_async_wait_completes_the_future_on_the_waiting_thread(callee):
    """wait() turns the answer into Python objects and completes the future
    itself, so callbacks added before it run on the waiting thread; the
    answer then costs no hand-off to tether's completer threads, where they
    ran before (then: on this thread in none of the 20 calls)."""
    me = threading.get_ident()
    ran_on = []
    for i in range(20):
        seconds = 0.02 + i / 1000
        fut = rpc.rpc_async(callee, rpc_functions.slow, args=(seconds,))
        fut.add_done_callback(lambda f: ran_on.append(threading.get_ident()))
        assert fut.wait() == seconds
        assert fut.done()
    assert len(ran_on) == 20
    assert me in ran_on
    failing = rpc.rpc_async(callee, rpc_functions.fail, args=("waited",))
    with pytest.raises(ValueError, match="waited"):
        failing.wait()
    assert isinstance(failing, torch.futures.Future)


def test_rpc_async_error_raises_at_wait(callee):
    fut = rpc.rpc_async(callee, rpc_functions.fail, args=("later",))
    with pytest.raises(ValueError, match="later"):
        fut.wait()


def test_values_the_receiver_does_not_trust_are_refused_there(callee):
    # Not wire values: they travel pickled, and the callee's unpickler
    # refuses what its policy does not name.
    with pytest.raises(RuntimeError, match=r"calling 'py::rpc_functions:"
                       r"echo': refused to unpickle .* the global "
                       r"builtins\.object is not allowed"):
        rpc.rpc_sync(callee, rpc_functions.echo, args=(object(),))
    # A set, a torch.nn module: rebuilt.
    assert rpc.rpc_sync(callee, rpc_functions.echo, args=([1, {2}],)) == \
        [1, {2}]
    assert isinstance(rpc.rpc_sync(callee, rpc_functions.echo, kwargs={
        "value": torch.nn.Linear(1, 1)}), torch.nn.Linear)
    with pytest.raises(TypeError, match="lambda"):
        rpc.rpc_sync(callee, lambda: 1)


def test_functions_and_classes_travel_by_reference_as_arguments(callee):
    apply = rpc_functions.apply
    assert rpc.rpc_sync(callee, apply, args=(rpc_functions.add, 1, 2)) == 3
    # A class method, a torch builtin, a harmless builtin, a class.
    assert rpc.rpc_sync(callee, apply,
                        args=(rpc_functions.Accumulator.start_at, 4)) == 4
    assert torch.equal(rpc.rpc_sync(callee, apply,
                                    args=(torch.add, torch.ones(1), 1)),
                       torch.full((1,), 2.0))
    assert rpc.rpc_sync(callee, apply, args=(max, [1, 3, 2])) == 3
    made = rpc.remote(callee, apply, args=(rpc_functions.Accumulator, 7))
    assert made.rpc_sync().add(0) == 7
    # The peer's _call_method(Class.method, rref); a keyword argument.
    rref = rpc.remote(callee, rpc_functions.Accumulator, args=(1,))
    assert rpc.rpc_sync(callee, rpc_functions.call_method,
                        args=(rpc_functions.Accumulator.add, rref, 2)) == 3
    assert rpc.rpc_sync(callee, max, args=([1, -3],),
                        kwargs={"key": abs}) == -3
    with pytest.raises(TypeError, match=r"argument 2 of "
                       r"'py::rpc_functions:apply': .*lambda"):
        rpc.rpc_sync(callee, apply, args=(1, lambda: 1))
    with pytest.raises(TypeError, match="bound to a Accumulator object"):
        rpc.rpc_sync(callee, apply, args=(rpc_functions.Accumulator(1).add,))


def test_rref_type_texts_and_missing_methods(callee):
    acc = rpc.remote(callee, rpc_functions.Accumulator, args=(5,))
    assert acc._get_type() is rpc_functions.Accumulator
    fut = acc._get_type(blocking=False)
    assert fut is acc._get_type(blocking=False)  # cached on the object
    assert fut.wait() is rpc_functions.Accumulator
    summed = rpc.remote(callee, torch.add, args=(torch.ones(1), 1))
    assert summed._get_type(timeout=30) is torch.Tensor
    assert rpc.RRef(3)._get_type() is int
    assert rpc.RRef(rpc_functions.Accumulator(0))._get_type(
        blocking=False).wait() is rpc_functions.Accumulator
    failed = rpc.remote(callee, rpc_functions.fail, args=("no type",))
    with pytest.raises(ValueError, match="no type"):
        failed._get_type()
    with pytest.raises(ValueError, match="no type"):
        failed._get_type(blocking=False).wait()
    # As the peer's: a method the type lacks fails at the call.
    missing = "type object 'Accumulator' has no attribute 'nothing'"
    with pytest.raises(AttributeError, match=missing):
        acc.remote().nothing()
    with pytest.raises(AttributeError, match=missing):
        acc.rpc_async().nothing().wait()
    assert acc.rpc_async().add(1).wait() == 6
    gid = r"GloballyUniqueId\(created_on=0, local_id=\d+\)"
    assert re.fullmatch(r"UserRRef\(RRefId = %s, ForkId = %s\)" % (gid, gid),
                        str(acc)), str(acc)
    assert re.fullmatch(r"OwnerRRef\(%s\)" % gid, repr(rpc.RRef(1)))
    with pytest.raises(RuntimeError, match=(
            r"For UserRRef\(rref_id=%s, fork_id=%s\), can't call "
            r"localValue\(\) on user WorkerInfo\(id=0, name=caller\)\. "
            r"Call it on owner WorkerInfo\(id=1, name=callee\)")
            % (gid, gid)):
        acc.local_value()


def test_timeout(callee):
    with pytest.raises(RuntimeError, match="(?i)deadline|timed out"):
        rpc.rpc_sync(callee, rpc_functions.slow, args=(5,), timeout=0.2)


def test_remote_and_rrefs(callee):
    rref = rpc.remote(callee, torch.add, args=(torch.ones(2), 1))
    assert torch.equal(rref.to_here(), torch.full((2,), 2.0))
    assert rref.owner().name == "callee" and rref.owner_name() == "callee"
    assert not rref.is_owner()
    local = rpc.RRef(torch.ones(3))
    assert local.is_owner() and local.owner().name == "caller"
    assert torch.equal(local.local_value(), torch.ones(3))
    assert torch.equal(local.to_here(), torch.ones(3))
    # The callee fetches a value the caller owns.
    assert torch.equal(rpc.rpc_sync(callee, rpc_functions.fetch_twice,
                                    args=(local,)), torch.full((3,), 2.0))


def test_remote_python_object_stays_on_its_owner_and_copies_by_value(
        callee):
    rref = rpc.remote(callee, rpc_functions.Accumulator, args=(5,))
    assert rpc.rpc_sync(callee, rpc_functions.total_of, args=(rref,)) == 5
    copy = rref.to_here()
    assert isinstance(copy, rpc_functions.Accumulator) and copy.total == 5
    copy.add(1)  # a copy: the owner's object is unchanged
    assert rpc.rpc_sync(callee, rpc_functions.total_of, args=(rref,)) == 5


def test_nested_calls_back_to_the_waiting_caller(callee):
    t = torch.ones(2)
    assert torch.equal(rpc.rpc_sync(callee, rpc_functions.add_on,
                                    args=("caller", t, t)), 2 * t)
    # The caller's pool runs Python while its main thread waits: the wait
    # released the GIL.
    assert rpc.rpc_sync(callee, rpc_functions.python_add_on,
                        args=("caller", 20, 22)) == 42


def _named(events, name):
    return [e for e in events if e.name == name]


def test_calls_under_the_legacy_profiler_bring_back_the_callees_events(
        callee):
    from torch.autograd.profiler_legacy import profile
    a = torch.ones(2, 3)
    with profile(record_shapes=True) as prof:
        rpc.rpc_sync(callee, torch.mul, args=(a, a))
        rpc.rpc_async(callee, rpc_functions.add, args=(a, a)).wait()
        rref = rpc.remote(callee, torch.sub, args=(a, a))
        rref._get_profiling_future().wait()
    events = prof.function_events
    for mode, name, op in [(rpc.RPCExecMode.SYNC, "aten::mul", "aten::mul"),
                           (rpc.RPCExecMode.ASYNC, "add", "aten::add"),
                           (rpc.RPCExecMode.REMOTE, "aten::sub", "aten::sub")]:
        key = rpc._build_rpc_profiling_key(mode, name, "caller", callee)
        assert key == "rpc_%s#%s(caller -> %s)" % (mode.value, name, callee)
        [call] = _named(events, key)
        assert (call.node_id, call.is_remote, call.count) == (0, False, 1)
        [remote] = _named(events, key + "#remote_op: " + op)
        assert (remote.node_id, remote.is_remote) == (1, True)
        # The caller's settings travelled: the callee recorded shapes.
        assert remote.input_shapes[:2] == [[2, 3], [2, 3]], remote
        # One clock on one machine: the callee's op ran within the call.
        assert call.time_range.start <= remote.time_range.start
        assert remote.time_range.end <= call.time_range.end


def test_a_profiled_calls_onward_calls_come_back_nested(callee):
    from torch.autograd.profiler_legacy import profile
    with profile() as prof:
        rpc.rpc_sync(callee, rpc_functions.async_add,
                     args=("caller", torch.ones(2), torch.ones(2)))
    outer = "rpc_sync#async_add(caller -> callee)#remote_op: "
    inner = "rpc_async#aten::add(callee -> caller)"
    names = [e.name for e in prof.function_events]
    [call] = _named(prof.function_events, outer + inner)
    assert call.node_id == 1, names  # the callee's call back to us
    [add] = _named(prof.function_events,
                   outer + inner + "#remote_op: aten::add")
    assert add.node_id == 0, names  # run here, reported through the callee
    # This thread may have served that call itself while it waited (the
    # assist, with busy_poll): it is the callee's profile's, not ours.
    assert not [e for e in prof.function_events
                if e.name == "aten::add" and not e.is_remote], names


def test_the_kineto_profiler_is_not_carried(callee):
    # As the peer: only the legacy profiler profiles calls remotely.
    with torch.profiler.profile() as prof:
        rpc.rpc_sync(callee, torch.mul, args=(torch.ones(1), torch.ones(1)))
    assert not [e for e in prof.events() if e.name.startswith("rpc_")]
    assert not [e for e in prof.events() if "#remote_op: " in e.name]


def test_gil_profiling_reports_the_average_wait(callee):
    key = "agent.gil_average_wait_time_us"
    agent = rpc._get_current_rpc_agent()
    assert key not in agent.get_debug_info()  # off by default, as the peer
    rpc.enable_gil_profiling(True)
    try:
        # The callee calls a Python function back here: a pool thread of
        # this worker takes the GIL for it, timed.
        assert torch.equal(
            rpc.rpc_sync(callee, rpc_functions.python_add_on,
                         args=("caller", torch.ones(1), torch.ones(1))),
            torch.full((1,), 2.0))
        assert int(agent.get_debug_info()[key]) >= 0
    finally:
        rpc.enable_gil_profiling(False)
    assert key not in agent.get_debug_info()


def test_rpc_async_values_come_back_as_rpc_sync_gives_them(callee):
    # The same Python values, whether read from wait(), value() or in a
    # callback: tensors, numbers, strings, None, containers of them, a
    # dtype, an RRef.
    values = [
        {"t": torch.arange(3), "xs": [1, 2], "nested": (None, "s", 1.5,
                                                        [torch.ones(1)]),
         "flags": [True, False], "empty": []}, {7: "int key", 8: None},
        (1, (2, (3, "deep"))), "text", 3, 2.5, None, True,
        torch.float64, [torch.int8, 1],
    ]
    for value in values:
        synced = rpc.rpc_sync(callee, rpc_functions.echo, args=(value,))
        fut = rpc.rpc_async(callee, rpc_functions.echo, args=(value,))
        seen = []
        called = threading.Event()

        def callback(f, seen=seen, called=called):
            seen.append(f.value())
            called.set()

        fut.add_done_callback(callback)
        waited = fut.wait()
        # The callback runs on the thread that completed the future, which
        # may be after wait() returned (as with torch's futures).
        assert called.wait(30), value
        for got in (waited, fut.value(), seen[0]):
            assert type(got) is type(synced), (value, got)
            assert repr(got) == repr(synced), (value, got)
    rref = rpc.remote(callee, rpc_functions.echo, args=(1,))
    back = rpc.rpc_async(callee, rpc_functions.echo, args=(rref,)).wait()
    assert isinstance(back, rpc.RRef) and back.to_here() == 1


def test_errors_under_the_profiler_are_the_same_errors(callee):
    from torch.autograd.profiler_legacy import profile
    with profile() as prof:
        with pytest.raises(ValueError, match="boom"):
            rpc.rpc_sync(callee, rpc_functions.fail, args=("boom",))
        with pytest.raises(ValueError, match="bang"):
            rpc.rpc_async(callee, rpc_functions.fail, args=("bang",)).wait()
        rref = rpc.remote(callee, rpc_functions.fail, args=("late",))
        with pytest.raises(ValueError, match="late"):
            rref.to_here()
        # and the worker still answers, profiled
        assert rpc.rpc_sync(callee, torch.add, args=(1, 2)) == 3
    names = [e.name for e in prof.function_events]
    assert "rpc_sync#fail(caller -> callee)" in names, names
    assert "rpc_async#fail(caller -> callee)" in names, names


def test_server_process_global_profile_sees_every_request_served(callee):
    # The callee calls a Python function back here: this worker serves it
    # while its process-wide profiles are on.
    def served_add():
        return rpc.rpc_sync(callee, rpc_functions.python_add_on,
                            args=("caller", torch.ones(2), torch.ones(2)))

    with rpc._server_process_global_profile() as outer:
        served_add()
        with rpc._server_process_global_profile(record_shapes=True) as inner:
            served_add()
        assert not rpc._server_process_global_profile().entered
    assert len(outer.process_global_function_events) == 2
    assert len(inner.process_global_function_events) == 1
    for prof in (outer, inner):
        adds = [e for e in prof.function_events if e.name == "aten::add"]
        assert adds and all(not e.is_remote for e in adds), [
            e.name for e in prof.function_events]
    [add] = [e for e in inner.function_events if e.name == "aten::add"]
    assert add.input_shapes[:2] == [[2], [2]]
    assert "aten::add" in str(outer.key_averages())
    # Off again: nothing more is gathered, and calls are as before.
    assert torch.equal(served_add(), torch.full((2,), 2.0))
