"""tether leaves a Python process's signals alone (docs/reliability.md,
"Signals"): `import tether.rpc`, init_rpc on each backend, a call and
shutdown change no signal's disposition, and SIGTERM ends a busy worker at
once, killed by SIGTERM. This test's own process never imports tether:
each case runs signal_worker.py in fresh processes.

Before the libfabric backend opened libfabric.so.1 only when chosen,
`import tether.rpc` loaded it, and with it libinfinipath, whose constructor
installed handlers for SIGINT (replacing Python's), SIGILL, SIGABRT,
SIGBUS, SIGSEGV and SIGTERM that print "terminated with signal N" and call
exit() inside the handler.
"""
import json
import os
import select
import signal
import time

import pytest

import workers

WORKER = os.path.join(workers.HERE, "signal_worker.py")
# A worker killed by a signal is gone in milliseconds; the bound leaves room
# for a loaded 2-core machine, not for a process stuck in exit handlers.
EXIT_BOUND_S = 5
# Loading torch and tether and forming the group, on a loaded machine.
START_BOUND_S = 120
SIGTERM_ROUNDS = 4


def stages(output):
    """{stage: report} from the lines signal_worker.py dispositions prints."""
    found = {}
    for line in output.splitlines():
        stage, _, rest = line.partition(" ")
        if rest.startswith("{"):
            found[stage] = json.loads(rest)
    return found


def changes(before, after):
    """The signals whose disposition differs, as "N: was -> is" lines."""
    return ["%s: %s -> %s" % (signal, before[signal], after.get(signal))
            for signal in before if before[signal] != after.get(signal)]


@pytest.mark.parametrize("backend", workers.BACKENDS)
def test_import_init_and_shutdown_leave_dispositions_alone(backend):
    env = workers.group_env(0, 1, workers.free_port(), backend)
    [(rc, out)] = workers.finish([workers.spawn([WORKER, "dispositions"], env)],
                                 timeout=START_BOUND_S)
    assert rc == 0, out
    found = stages(out)
    assert set(found) == {"start", "torch", "import", "init", "shutdown"}, out
    for stage in ("start", "import", "init", "shutdown"):
        print(backend, stage, "SigCgt", found[stage]["proc"]["SigCgt"],
              "SigIgn", found[stage]["proc"]["SigIgn"])
    start = found["start"]["dispositions"]
    for stage in ("torch", "import", "init", "shutdown"):
        assert changes(start, found[stage]["dispositions"]) == [], (
            "after %s on %s" % (stage, backend))
    # libfabric is loaded only by a worker that chose it.
    assert not found["import"]["libfabric"]
    assert found["init"]["libfabric"] == (backend == "libfabric")


def wait_for_exit(proc, timeout):
    """Waits up to `timeout` seconds for `proc` to end, woken by its pidfd
    as it does (Popen.wait polls every 50 ms); its returncode, or None while
    it runs."""
    fd = os.pidfd_open(proc.pid)
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return proc.poll()


def start_pair(mode, backend):
    port = workers.free_port()
    return [workers.spawn([WORKER, mode, str(rank)],
                          workers.group_env(rank, 2, port, backend))
            for rank in range(2)]


def stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    return workers.finish(procs, timeout=30)


@pytest.mark.parametrize("backend", workers.BACKENDS)
def test_sigterm_ends_a_busy_worker_promptly(backend):
    took = []
    for attempt in range(SIGTERM_ROUNDS):
        procs = start_pair("busy", backend)
        try:
            workers.read_until(procs[0], "spinning", timeout=START_BOUND_S)
            sent = time.monotonic()
            procs[0].send_signal(signal.SIGTERM)
            rc = wait_for_exit(procs[0], EXIT_BOUND_S)
            took.append(time.monotonic() - sent)
        finally:
            results = stop(procs)
        assert rc == -signal.SIGTERM, (
            "round %d on %s: after SIGTERM, %s after %.3f s; output:\n%s"
            % (attempt, backend,
               "still running" if rc is None else "returncode %s" % rc,
               took[-1], results[0][1]))
    took.sort()
    print("%s: SIGTERM to a busy Python worker, %d rounds: exit after "
          "%.1f ms (median) to %.1f ms (max)"
          % (backend, len(took), 1000 * took[len(took) // 2], 1000 * took[-1]))


@pytest.mark.parametrize("backend", workers.BACKENDS)
def test_abort_in_a_called_function_ends_the_worker_with_sigabrt(backend):
    procs = start_pair("abort", backend)
    try:
        workers.read_until(procs[0], "crashing", timeout=START_BOUND_S)
        rc = wait_for_exit(procs[0], EXIT_BOUND_S)
    finally:
        results = stop(procs)
    assert rc == -signal.SIGABRT, (
        "on %s: %s; output:\n%s"
        % (backend, "still running" if rc is None else "returncode %s" % rc,
           results[0][1]))
