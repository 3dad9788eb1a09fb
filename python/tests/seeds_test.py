"""The peer's second and third seed programs (examples/python/) on every
backend, and the same files with their import lines swapped on the peer
(torch.distributed.rpc): the programs really are the peer's."""
import os
import re

import pytest

import workers
from peer_programs import EXAMPLES, peer_version

REMOTE_RREF = os.path.join(EXAMPLES, "remote_rref_seed.py")
SPLIT_MODEL = os.path.join(EXAMPLES, "split_model_seed.py")


def run(path, world_size, backend):
    results = workers.run_group(path, world_size, backend,
                                args_for_rank=lambda rank: [str(rank)],
                                timeout=150)
    for rc, out in results:
        assert rc == 0, out
    return results[0][1]


def check_remote_rref(out):
    assert "to_here sum: tensor([6., 6.])" in out, out
    assert "local_value on the owner: tensor([8., 8.])" in out, out
    assert "shared local RRef: tensor([[1., 1.],\n        [1., 1.]])" in out, out
    assert "owners: worker0 worker1" in out, out


def check_split_model(out):
    losses = [float(v) for v in re.findall(r"^step \d+ loss ([0-9.]+)$", out,
                                           re.M)]
    assert len(losses) >= 20, out
    assert losses[-1] < losses[0] / 2, losses
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= len(losses) - 2


SEEDS = {
    "remote_rref": (REMOTE_RREF, 2, check_remote_rref),
    "split_model": (SPLIT_MODEL, 3, check_split_model),
}


@pytest.mark.parametrize("backend", workers.BACKENDS)
@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_seed_runs_on_each_backend(seed, backend):
    path, world_size, check = SEEDS[seed]
    check(run(path, world_size, backend))


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_seed_is_the_peers_but_for_the_import_lines(seed, tmp_path):
    path, world_size, check = SEEDS[seed]
    check(run(peer_version(path, tmp_path), world_size, "tensorpipe"))
