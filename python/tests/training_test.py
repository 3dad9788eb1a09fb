"""tether.autograd, tether.optim and RRef proxies from Python, against a
real worker process on loopback, on every backend."""
import os
import threading

import pytest
import torch
import torch.nn as nn
from torch import optim

import tether.autograd as dist_autograd
import tether.rpc as rpc
from tether.optim import DistributedOptimizer
import rpc_functions
import training_functions as tf
import workers
from tether.rpc import _proxy



@pytest.fixture(scope="module", params=workers.BACKENDS)
def callee(request):
    """This process is "caller" (rank 0); callee.py is rank 1 and allows
    rpc_functions and training_functions, as does the caller."""
    with workers.with_callee(request.param,
                             ["rpc_functions", "training_functions"]) as name:
        yield name


def leaf(*values):
    return torch.tensor(values, requires_grad=True)


def test_gradients_cross_a_builtin_call(callee):
    t1, t2 = leaf(1.0, 2.0), leaf(3.0, 4.0)
    with dist_autograd.context() as context_id:
        assert isinstance(context_id, int)
        loss = rpc.rpc_sync(callee, torch.mul, args=(t1, t2)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)
        assert set(grads) == {t1, t2}  # the caller's own tensors are keys
        assert torch.equal(grads[t1], t2.detach())
        assert torch.equal(grads[t2], t1.detach())
    assert t1.grad is None and t2.grad is None  # never in .grad


def test_gradients_cross_python_functions_async_calls_and_remote(callee):
    a, b = leaf(2.0), leaf(5.0)
    with dist_autograd.context() as context_id:
        y = rpc.rpc_sync(callee, tf.mul_add, args=(a, b))            # ab + a
        z = rpc.rpc_async(callee, tf.mul_add, args=(a, b)).wait()    # ab + a
        w = rpc.remote(callee, torch.mul, args=(a, a)).to_here()     # a^2
        dist_autograd.backward(context_id, [(y + z + w).sum()])
        grads = dist_autograd.get_gradients(context_id)
        assert grads[a].item() == pytest.approx(2 * (5 + 1) + 2 * 2)
        assert grads[b].item() == pytest.approx(2 * 2)


def test_gradients_cross_nested_calls_back_to_the_caller(callee):
    a, b = leaf(1.0, 1.0), leaf(2.0, 3.0)
    with dist_autograd.context() as context_id:
        # The callee's Python function calls torch.add on the caller.
        y = rpc.rpc_sync(callee, rpc_functions.add_on, args=("caller", a, b))
        dist_autograd.backward(context_id, [(y * y).sum()])
        grads = dist_autograd.get_gradients(context_id)
        assert torch.equal(grads[a], 2 * (a + b).detach())
        assert torch.equal(grads[b], 2 * (a + b).detach())


def test_remote_module_gradients_stay_on_its_owner(callee):
    module = rpc.remote(callee, tf.Model, args=(3, 1))
    x = torch.ones(2, 3)
    with dist_autograd.context() as context_id:
        out = module.rpc_sync().forward(x)
        dist_autograd.backward(context_id, [out.sum()])
        weight_grad, bias_grad = rpc.rpc_sync(
            callee, tf.gradients_here, args=(module, context_id))
        assert torch.equal(weight_grad, torch.full((1, 3), 2.0))
        assert torch.equal(bias_grad, torch.tensor([2.0]))
        # This worker holds no gradient of the callee's parameters.
        assert dist_autograd.get_gradients(context_id) == {}
    assert rpc.rpc_sync(callee, tf.grads_are_not_in_dot_grad, args=(module,))


def test_backward_twice_needs_retain_graph(callee):
    a = leaf(3.0)
    with dist_autograd.context() as context_id:
        # sin keeps a saved tensor here, which backward frees.
        loss = torch.sin(rpc.rpc_sync(callee, torch.mul, args=(a, a))).sum()
        dist_autograd.backward(context_id, [loss], retain_graph=True)
        once = dist_autograd.get_gradients(context_id)[a].clone()
        assert once.item() == pytest.approx(torch.cos(torch.tensor(9.0)) * 6)
        dist_autograd.backward(context_id, [loss])
        # Gradients accumulate in the context.
        assert torch.allclose(dist_autograd.get_gradients(context_id)[a],
                              2 * once)
        with pytest.raises(RuntimeError, match="(?i)backward through the "
                                               "graph a second time"):
            dist_autograd.backward(context_id, [loss])


def test_context_errors(callee):
    with dist_autograd.context() as context_id:
        assert dist_autograd._current_context()._context_id() == context_id
        # Ids: this worker's rank (0) in the top 16 bits, as the peer's.
        assert context_id >> 48 == 0
        assert dist_autograd._get_max_id() == (1 << 48) - 1
        # The workers its messages reach (the peer's _known_worker_ids()).
        assert dist_autograd._current_context()._known_worker_ids() == set()
        rpc.rpc_sync(callee, torch.add, args=(torch.ones(1), 1))
        assert dist_autograd._retrieve_context(
            context_id)._known_worker_ids() == {1}
        # The graph's send and recv functions, named and shaped as the
        # peer's: the send's next functions are the arguments' accumulators,
        # the recv is the result's grad_fn.
        a, b = leaf(1.0), leaf(2.0)
        product = rpc.rpc_sync(callee, torch.mul, args=(a, b))
        ctx = dist_autograd._current_context()
        (send,) = ctx._send_functions().values()
        (recv,) = ctx._recv_functions().values()
        assert send.name() == "torch::distributed::autograd::SendRpcBackward"
        (fa, _), (fb, _) = send.next_functions
        assert fa.variable is a and fb.variable is b
        assert product.grad_fn is recv
        assert recv.name() == "torch::distributed::autograd::RecvRpcBackward"
        with pytest.raises(RuntimeError, match="contexts do not nest"):
            with dist_autograd.context():
                pass
        with pytest.raises(TypeError, match=r"roots\[0\] is not a tensor"):
            dist_autograd.backward(context_id, ["loss"])
        with pytest.raises(TypeError, match="roots must be a list"):
            dist_autograd.backward(context_id, leaf(1.0))
    with pytest.raises(RuntimeError, match=str(context_id)):
        dist_autograd.get_gradients(context_id)  # released at exit
    with pytest.raises(RuntimeError, match="Could not find autograd context "
                                           "with id: %d" % context_id):
        dist_autograd._retrieve_context(context_id)
    # A context made on one thread and released from another, as the
    # peer's _new_context() and _release_context().
    made = []

    def make():
        made.append(dist_autograd._new_context())
        assert dist_autograd._current_context()._context_id() == \
            made[0]._context_id()
        rpc.rpc_sync(callee, torch.add, args=(torch.ones(1), 1))

    maker = threading.Thread(target=make)
    maker.start()
    maker.join()
    by_hand = made[0]._context_id()
    assert dist_autograd._retrieve_context(by_hand)._known_worker_ids() == {1}
    dist_autograd._release_context(by_hand)
    with pytest.raises(RuntimeError, match="Could not find autograd context"):
        dist_autograd._retrieve_context(by_hand)
    with pytest.raises(RuntimeError, match="Could not find autograd context"):
        dist_autograd._release_context(by_hand)
    with pytest.raises(RuntimeError, match="no distributed autograd context"):
        dist_autograd._current_context()
    with pytest.raises(RuntimeError, match="12345"):
        dist_autograd.backward(12345, [leaf(1.0).sum()])
    # A context id after the exit is a fresh one.
    with dist_autograd.context() as again:
        assert again != context_id


def test_rref_backward(callee):
    a = leaf(1.0, 2.0)
    with dist_autograd.context() as context_id:
        # A user of an RRef whose value is a scalar the callee computed.
        rref = rpc.remote(callee, tf.scalar_sum, args=(a,))
        rref.backward(context_id)
        assert torch.equal(dist_autograd.get_gradients(context_id)[a],
                           torch.full((2,), 3.0))
        with pytest.raises(RuntimeError, match="only the RRef's owner"):
            rref.backward()
    # -1: a local backward pass on the owner, into .grad.
    b = leaf(1.0, 2.0)
    local = rpc.RRef((b * b).sum())
    local.backward()
    assert torch.equal(b.grad, torch.tensor([2.0, 4.0]))
    with pytest.raises(RuntimeError, match="holds a"):
        rpc.RRef("text").backward()


def test_rref_proxies_call_methods_on_the_owner(callee):
    acc = rpc.remote(callee, rpc_functions.Accumulator, args=(5,))
    assert acc.rpc_sync().add(1) == 6
    fut = acc.rpc_async().add(2)
    assert isinstance(fut, torch.futures.Future.__mro__[1])
    assert fut.wait() == 8
    total = acc.remote().add(3)
    assert isinstance(total, rpc.RRef) and total.owner().name == callee
    assert total.to_here() == 11
    assert acc.rpc_sync(timeout=30).add(x=0) == 11  # keyword arguments
    module = rpc.remote(callee, tf.Model, args=(2, 1))
    x = torch.ones(1, 2)
    assert torch.equal(module.rpc_sync().forward(x),
                       module.rpc_sync().__call__(x))
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        acc.rpc_sync().nothing()
    # The owner calls no dunder method but __call__, whoever asks.
    with pytest.raises(RuntimeError, match="never other dunder methods"):
        rpc.rpc_sync(callee, _proxy.invoke,
                     args=(module, "__setattr__", ("training", 1), {}))
    # An RRef of a Python object this worker owns, proxied by either side.
    mine = rpc.RRef(rpc_functions.Accumulator(10))
    assert mine.rpc_sync().add(1) == 11
    assert rpc.rpc_sync(callee, rpc_functions.add_through_proxy,
                        args=(mine, 4)) == 15
    assert mine.local_value().total == 15
    # A private method is a method like any other, as in the peer.
    assert module.rpc_sync()._private() == "private"


def test_rref_creation_future(callee):
    ok = rpc.remote(callee, rpc_functions.Accumulator, args=(1,))
    fut = ok._get_future()
    assert isinstance(fut, torch.futures.Future.__mro__[1])
    assert fut.wait() is None
    failed = rpc.remote(callee, rpc_functions.fail, args=("no value",))
    with pytest.raises(ValueError, match="no value"):
        failed._get_future().wait()
    assert rpc.RRef(torch.ones(1))._get_future().wait() is None
    # A remote() past its timeout: the creation future fails with the
    # timeout, and the RRef's first use names the failed creation (the
    # peer's test_rref_timeout).
    late = rpc.remote(callee, rpc_functions.slow, args=(1,), timeout=0.05)
    with pytest.raises(rpc.RpcTimeoutError, match="RPC ran for more than"):
        late._get_future().wait()
    with pytest.raises(RuntimeError, match="RRef creation"):
        late.to_here()


def test_parameter_rrefs_and_distributed_optimizer_match_torch_optim(callee):
    """Each kind steps the callee's parameters exactly as torch.optim steps a
    copy of them here with the same gradients."""
    cases = [
        (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
        (optim.SGD, dict(lr=0.05)),
        (optim.Adam, dict(lr=0.01, betas=(0.8, 0.9), amsgrad=True)),
        (optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
        (optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
        (optim.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
        # Built in Python on the owner: another torch.optim class, one of
        # the five with an argument LibTorch lacks, a user's class.
        (optim.Adadelta, dict(rho=0.95)),
        (optim.Rprop, dict(lr=0.05)),
        (optim.Adam, dict(lr=0.01, maximize=True)),
        (tf.SignSGD, dict(lr=0.1)),
    ]
    x = torch.arange(6.0).reshape(2, 3)
    for cls, kwargs in cases:
        module = rpc.remote(callee, tf.Model, args=(3, 1))
        params = module.rpc_sync().parameter_rrefs()
        assert len(params) == 2 and all(isinstance(p, rpc.RRef) for p in params)
        assert all(p.owner().name == callee for p in params)
        local = tf.Model(3, 1)  # the same fixed initial values
        local_opt = cls(local.parameters(), **kwargs)
        dist_opt = DistributedOptimizer(cls, params, **kwargs)
        for _ in range(3):
            with dist_autograd.context() as context_id:
                loss = (module.rpc_sync().forward(x) ** 2).sum()
                dist_autograd.backward(context_id, [loss])
                dist_opt.step(context_id)
            local_opt.zero_grad()
            (local(x) ** 2).sum().backward()
            local_opt.step()
        remote_values = module.rpc_sync().parameter_values()
        for got, want in zip(remote_values, local.parameters()):
            assert torch.allclose(got, want.detach(), atol=1e-5), (cls, kwargs)
        assert not torch.equal(remote_values[0], tf.Model(3, 1).linear.weight)


def test_distributed_optimizer_over_parameters_of_two_workers(callee):
    mine = nn.Parameter(torch.ones(2))
    module = rpc.remote(callee, tf.Model, args=(2, 1))
    params = [rpc.RRef(mine)] + module.rpc_sync().parameter_rrefs()
    dist_opt = DistributedOptimizer(optim.SGD, params, lr=0.5)
    before = module.rpc_sync().parameter_values()
    with dist_autograd.context() as context_id:
        out = module.rpc_sync().forward(mine.unsqueeze(0))
        dist_autograd.backward(context_id, [out.sum()])
        grads = dist_autograd.get_gradients(context_id)
        dist_opt.step(context_id)
    assert torch.allclose(mine.detach(), 1 - 0.5 * grads[mine])
    after = module.rpc_sync().parameter_values()
    assert torch.allclose(after[1], before[1] - 0.5)  # bias grad is 1
    assert mine.grad is None


def test_distributed_optimizer_errors(callee):
    module = rpc.remote(callee, tf.Model, args=(2, 1))
    params = module.rpc_sync().parameter_rrefs()
    # A class of a module the owner does not allow: its refusal, naming
    # the class and how to allow it.
    with pytest.raises(RuntimeError, match=r"refused to run "
                       r"training_test\.Unallowed: module 'training_test' "
                       r"is not allowed.*allowed_modules"):
        DistributedOptimizer(Unallowed, params, lr=0.1)
    with pytest.raises(TypeError, match="must be a class"):
        DistributedOptimizer("SGD", params, lr=0.1)
    # The class's own errors, from its constructor and its step.
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        DistributedOptimizer(optim.Adadelta, params, lr=-1)
    failing = DistributedOptimizer(tf.FailingStep, params, lr=0.1)
    with dist_autograd.context() as context_id:
        dist_autograd.backward(
            context_id, [module.rpc_sync().forward(torch.ones(1, 2)).sum()])
        with pytest.raises(ValueError, match="no step today"):
            failing.step(context_id)
    with pytest.raises(ValueError, match="SGD needs the argument 'lr'"):
        DistributedOptimizer(optim.SGD, params)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        DistributedOptimizer(optim.SGD, params, lr=0.1, betas=(0.9, 0.9))
    DistributedOptimizer(optim.Adam, params, foreach=None)  # its default
    with pytest.raises(TypeError, match=r"params_rref\[1\] is a Tensor"):
        DistributedOptimizer(optim.SGD, [params[0], torch.ones(1)], lr=0.1)
    not_a_tensor = rpc.remote(callee, rpc_functions.echo, args=("text",))
    with pytest.raises(RuntimeError, match="callee"):
        DistributedOptimizer(optim.SGD, [not_a_tensor], lr=0.1)
    opt = DistributedOptimizer(optim.SGD, params, lr=0.1)
    with pytest.raises(RuntimeError, match="424242"):
        opt.step(424242)


class UnallowedModule(nn.Linear):
    """A module class of this test file, which the callee does not allow."""


class Unallowed(tf.SignSGD):
    """An optimizer class of this module, which the callee does not
    allow."""


def test_remote_module_travels_as_a_reference(callee):
    from tether.nn.api.remote_module import RemoteModule
    remote = RemoteModule("%s/cpu" % callee, tf.Model, args=(3, 1))
    x = torch.ones(2, 3)
    local = tf.Model(3, 1)
    # Sent to a worker (here its owner), which trains through it.
    after = rpc.rpc_sync(callee, tf.train_through, args=(remote, x, 0.1))
    local(x).sum().backward()
    optim.SGD(local.parameters(), lr=0.1).step()
    assert torch.allclose(after, local(x))
    # And back: the same module, on the same owner.
    back = rpc.rpc_sync(callee, rpc_functions.echo, args=(remote,))
    assert isinstance(back, RemoteModule) and back.on == remote.on
    assert torch.allclose(back(x), local(x))
    assert [p.owner().name for p in back.remote_parameters()] == [callee] * 2


def test_remote_module(callee):
    from tether.nn.api.remote_module import RemoteModule
    import tether.nn
    assert tether.nn.RemoteModule is RemoteModule
    remote = RemoteModule("%s/cpu" % callee, tf.Model, args=(3, 1))
    by_rank = RemoteModule("rank:1/cpu", tf.Model, kwargs=dict(
        in_features=3, out_features=1))
    assert by_rank.get_module_rref().owner().name == callee
    local = tf.Model(3, 1)
    x = torch.ones(2, 3)
    assert torch.allclose(remote(x), local(x))
    assert torch.allclose(remote.forward_async(x).wait(), local(x))
    params = remote.remote_parameters()
    assert [p.owner().name for p in params] == [callee, callee]
    dist_opt = DistributedOptimizer(optim.SGD, params, lr=0.1)
    with dist_autograd.context() as context_id:
        dist_autograd.backward(context_id, [remote(x).sum()])
        dist_opt.step(context_id)
    (local(x).sum()).backward()
    optim.SGD(local.parameters(), lr=0.1).step()
    assert torch.allclose(remote(x), local(x))
    with pytest.raises(ValueError, match="not supported for RemoteModule"):
        remote.parameters()
    with pytest.raises(ValueError, match="names device 'cuda:0'"):
        RemoteModule("%s/cuda:0" % callee, tf.Model, args=(3, 1))
    with pytest.raises(ValueError, match="Could not parse remote_device"):
        RemoteModule("a/b/c", tf.Model)
    not_a_module = RemoteModule(callee, rpc_functions.Accumulator, args=(1,))
    with pytest.raises(ValueError, match="returns an instance of"):
        not_a_module.remote_parameters()
    # module_cls travels by reference: torch.nn's classes are callable as
    # torch's operators are; a class of a module the owner does not allow
    # is refused.
    linear = RemoteModule(callee, nn.Linear, args=(2, 2))
    assert linear(torch.ones(2)).shape == (2,)
    unallowed = RemoteModule(callee, UnallowedModule, args=(2, 2))
    with pytest.raises(RuntimeError, match="is not allowed"):
        unallowed(torch.ones(2))


class _RecordPasses(torch.autograd.Function):
    """Identity whose backward records the worker's running passes."""
    seen = []

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        _RecordPasses.seen.append(
            int(dist_autograd._get_debug_info()["num_current_backward_passes"]))
        return grad


def test_debug_info_counts_contexts_passes_and_threads(callee):
    # The peer's dist_autograd._get_debug_info(), rpc._get_debug_info() and
    # its agent's get_debug_info(): real counts, with the peer's keys.
    info = dist_autograd._get_debug_info()
    assert info == {"num_current_backward_passes": "0",
                    "num_autograd_contexts": "0"}
    _RecordPasses.seen = []
    with dist_autograd.context() as context_id:
        x = leaf(2.0)
        y = rpc.rpc_sync(callee, torch.mul, args=(x, x))
        assert dist_autograd._get_debug_info()["num_autograd_contexts"] == "1"
        dist_autograd.backward(context_id, [_RecordPasses.apply(y).sum()])
    assert _RecordPasses.seen == [1]
    assert dist_autograd._get_debug_info() == {
        "num_current_backward_passes": "0", "num_autograd_contexts": "0"}
    agent = rpc._get_current_rpc_agent().get_debug_info()
    assert int(agent["agent.thread_pool_size"]) == 16  # num_worker_threads
    assert 0 <= int(agent["agent.num_idle_threads"]) <= 16
    everything = rpc._get_debug_info()
    assert set(everything) == (set(agent) | set(info)
                               | set(rpc._rref_context_get_debug_info()))


def test_a_backward_that_comes_back_counts_once(callee):
    # caller -> callee -> caller -> callee: the backward comes back here, so
    # _RecordPasses' backward runs in a second engine pass of this context
    # while the root's pass waits on it. The peer counts backwards (its
    # contexts with a pass running), not engine passes: 1, not 2.
    _RecordPasses.seen = []
    with dist_autograd.context() as context_id:
        x = leaf(2.0)
        y = rpc.rpc_sync(callee, torch.mul, args=(x, x))
        z = rpc.rpc_sync(callee, torch.mul, args=(_RecordPasses.apply(y), x))
        dist_autograd.backward(context_id, [z.sum()])
        assert dist_autograd.get_gradients(context_id)[x].item() == 12.0
    assert _RecordPasses.seen == [1]
    assert dist_autograd._get_debug_info()["num_current_backward_passes"] == "0"


@pytest.mark.parametrize("backend", workers.BACKENDS)
def test_ddp_all_reduces_into_the_distributed_autograd_context(backend):
    results = workers.run_group(
        os.path.join(workers.HERE, "ddp_grads.py"), 2, backend,
        args_for_rank=lambda rank: [str(rank)],
        extra_env={"GLOO_PORT": str(workers.free_port())})
    for rank, (rc, out) in enumerate(results):
        assert rc == 0, out
        assert ("rank %d: context holds the average: True; .grad untouched: "
                "True" % rank) in out, out
