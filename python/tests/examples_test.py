"""The peer's tutorial programs (examples/python/) on every backend, and
the same files with their import lines swapped on the peer
(torch.distributed.rpc): each must learn on both, and where a program is
deterministic (one trainer, or two whose updates commute) its losses on
tether must be the peer's.

Processes of one program share an output pipe, and an unbuffered print
writes its text and its newline apart, so the patterns below do not rely
on lines: each value has a fixed number of decimals."""
import collections
import math
import os
import re

import pytest

import peer_programs
import workers
from peer_programs import EXAMPLES, peer_version

TIMEOUT = 100
TOLERANCE = 1e-4


def floats(pattern, out):
    return [float(v) for v in re.findall(pattern, out)]


def check_parameter_server(out):
    """A trainer that starts late finds the model half trained, so its
    final loss is held against chance's (4 classes), not its first."""
    assert "RPC shutdown on parameter server." in out, out
    for rank in (1, 2):
        found = re.search(r"Rank %d first loss \d+\.\d{4} final loss "
                          r"(\d+\.\d{4}) accuracy (\d\.\d{3})" % rank, out)
        assert found, out
        final, accuracy = map(float, found.groups())
        assert final < 0.6 * math.log(4) and accuracy > 0.75, found.group(0)


def rnn_losses(out):
    return floats(r"Training epoch \d+ loss (\d+\.\d{6})", out)


def check_rnn(out):
    losses = rnn_losses(out)
    assert len(losses) == 12, out
    assert losses[-1] < losses[0] / 2, losses


def pipeline_losses(out):
    return floats(r"epoch \d+ loss (\d+\.\d{6})", out)


def check_pipeline(out):
    losses = pipeline_losses(out)
    assert len(losses) == 10, out
    assert losses[-1] < losses[0] / 2, losses


def check_ddp_rpc(out):
    found = re.findall(r"Trainer \d first loss (\d+\.\d{4}) final loss "
                       r"(\d+\.\d{4})", out)
    assert len(found) == 2, out
    for first, final in found:
        assert float(final) < float(first) / 2, (first, final)


def check_rl_observers(out):
    found = re.search(r"reward first (\d\.\d{3}) last (\d\.\d{3})", out)
    assert found, out
    first, last = map(float, found.groups())
    assert last >= first + 0.15 and last >= 0.7, found.group(0)


def losses_by_trainer(out):
    """Each trainer's losses, in order."""
    losses = collections.defaultdict(list)
    for name, loss in re.findall(
            r"(trainer\d) reporting grads, loss (\d+\.\d{6})", out):
        losses[name].append(float(loss))
    return dict(losses)


def batch_ps_losses(out):
    losses = losses_by_trainer(out)
    return [loss for name in sorted(losses) for loss in losses[name]]


def check_batch_ps(out):
    losses = losses_by_trainer(out)
    assert sorted(losses) == ["trainer1", "trainer2"], out
    for name, values in losses.items():
        assert len(values) == 20, (name, out)
        assert values[-1] < values[0] / 4, (name, values)


# files: the script, then its own modules; world_size: one process per
# rank, or None for a script that starts its ranks itself; losses: what
# must equal the peer's, where the program is deterministic.
Example = collections.namedtuple(
    "Example", "files world_size check losses extra_env",
    defaults=(None, None))

EXAMPLES_BY_NAME = {
    # One process per rank (the tutorial's --rank); two trainers share the
    # server's model, in an order that varies.
    "parameter_server": Example(["parameter_server.py"], 3,
                                check_parameter_server),
    # The rest start their ranks with mp.spawn.
    "rnn": Example(["rnn/main.py", "rnn/rnn.py"], None, check_rnn,
                   rnn_losses),
    # The shards add up the micro-batches' gradients in an order that
    # varies: equal within the tolerance.
    "pipeline": Example(["pipeline.py"], None, check_pipeline,
                        pipeline_losses),
    # Both trainers step the shared embedding table, in an order that
    # varies; the trainers' process group meets on a port of its own.
    "ddp_rpc": Example(["ddp_rpc.py"], None, check_ddp_rpc,
                       extra_env=lambda: {"GLOO_PORT":
                                          str(workers.free_port())}),
    # The observers' requests reach the agent's sampler in an order that
    # varies.
    "rl_observers": Example(["rl_observers.py"], None, check_rl_observers),
    # The server sums two trainers' gradients: a + b is b + a.
    "batch_ps": Example(["batch_ps.py"], None, check_batch_ps,
                        batch_ps_losses),
}


def run(example, script, backend):
    """The program's output, every process's; fails unless each process
    exited 0."""
    extra_env = example.extra_env() if example.extra_env else None
    if example.world_size:
        results = peer_programs.run_per_rank(
            script, example.world_size, backend,
            args_for_rank=lambda rank: ["--rank", str(rank)],
            extra_env=extra_env, timeout=TIMEOUT)
    else:
        results = [peer_programs.run_launcher(script, backend, extra_env,
                                              timeout=TIMEOUT)]
    out = "".join(out for _, out in results)
    assert all(rc == 0 for rc, _ in results), out
    return out


@pytest.fixture(scope="module")
def peer_output(tmp_path_factory):
    """name -> the output of that program on the peer, run once."""
    outputs = {}

    def output(name):
        if name not in outputs:
            example = EXAMPLES_BY_NAME[name]
            folder = tmp_path_factory.mktemp(name)
            scripts = [peer_version(os.path.join(EXAMPLES, f), folder)
                       for f in example.files]
            try:
                outputs[name] = run(example, scripts[0], "tensorpipe")
            except AssertionError as error:
                outputs[name] = error
        if isinstance(outputs[name], AssertionError):
            raise AssertionError("on the peer: %s" % outputs[name])
        return outputs[name]

    return output


@pytest.mark.parametrize("name", sorted(EXAMPLES_BY_NAME))
def test_example_learns_on_the_peer(name, peer_output):
    EXAMPLES_BY_NAME[name].check(peer_output(name))


@pytest.mark.parametrize("backend", workers.BACKENDS)
@pytest.mark.parametrize("name", sorted(EXAMPLES_BY_NAME))
def test_example_learns_on_each_backend(name, backend, peer_output):
    example = EXAMPLES_BY_NAME[name]
    out = run(example, os.path.join(EXAMPLES, example.files[0]), backend)
    example.check(out)
    if example.losses:
        ours, peers = example.losses(out), example.losses(peer_output(name))
        assert ours == pytest.approx(peers, abs=TOLERANCE, rel=0), out
