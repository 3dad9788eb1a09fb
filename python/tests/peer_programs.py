"""The peer's programs of examples/python/ for seeds_test.py and
examples_test.py: the same files made the peer's (torch.distributed.rpc)
by their import lines, and a runner for programs that start processes of
their own (torch.multiprocessing)."""
import os
import re
import signal
import subprocess
import sys

import workers

EXAMPLES = os.path.join(workers.REPO, "examples", "python")


def peer_version(path, tmp_path):
    """The program with its tether imports made the peer's; every other
    line is left as it is. It keeps its file name in `tmp_path`, so a
    program's own modules, made the peer's beside it, import as they are
    named."""
    lines = open(path).read().splitlines(keepends=True)
    swapped = 0
    for i, line in enumerate(lines):
        if line.startswith(("import tether.", "from tether.")):
            lines[i] = line.replace("tether.", "torch.distributed.", 1)
            swapped += 1
    assert swapped > 0
    code = [l for l in lines if not l.startswith(("import ", "from "))]
    assert not any(re.search(r"\btether\b", l) for l in code
                   if not l.lstrip().startswith(("#", '"""'))
                   and "TETHER_BACKEND" not in l), "tether outside imports"
    peer = tmp_path / os.path.basename(path)
    assert not peer.exists(), peer
    peer.write_text("".join(lines))
    return str(peer)


def run(argv_per_process, envs, timeout):
    """Starts one process per argv (with its env), each in a session of
    its own, and waits for them all; returns [(returncode, output)]. After
    `timeout` seconds the sessions still running are killed whole: a
    program's own children (mp.spawn, mp.Process) hold its output pipe
    open, and would outlive a kill of the process alone."""
    procs = [subprocess.Popen([sys.executable] + list(argv), env=env,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
             for argv, env in zip(argv_per_process, envs)]
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                try:
                    os.killpg(other.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = proc.communicate()
            out += "\n[killed after %s s]" % timeout
        results.append((proc.returncode, out))
    return results


def run_per_rank(script, world_size, backend, args_for_rank, extra_env=None,
                 timeout=120):
    """`script` started once per rank (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT and TETHER_BACKEND set); returns [(returncode, output)]."""
    port = workers.free_port()
    return run([[script] + args_for_rank(rank) for rank in range(world_size)],
               [workers.group_env(rank, world_size, port, backend, extra_env)
                for rank in range(world_size)], timeout)


def run_launcher(script, backend, extra_env=None, timeout=120):
    """`script` started once, to start every rank itself (mp.spawn), with
    MASTER_ADDR, MASTER_PORT and TETHER_BACKEND set; returns
    (returncode, output)."""
    env = workers.group_env(0, 1, workers.free_port(), backend, extra_env)
    del env["RANK"], env["WORLD_SIZE"]
    return run([[script]], [env], timeout)[0]
