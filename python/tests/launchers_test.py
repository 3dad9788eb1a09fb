"""A worker lost under each launcher (docs/reliability.md, "Launchers and
faults"): one worker of three killed (SIGKILL) or terminated (SIGTERM),
with C++ workers (the main job, examples/train: a parameter server waiting
in shutdown() and two trainers) and Python workers (fault_worker.py: each
calls the others in a loop), under no launcher (the test starts the
workers: what they learn from tether alone), tether_run, torchrun
(`python3 -m torch.distributed.run`, Debian's python3-torch) and
torch.multiprocessing.spawn. The other workers must end, non-zero, within
SURVIVORS_BOUND_S of the kill, the launcher must fail, and no process of
the run may be left. Then tether_run itself: SIGTERM or SIGINT to it ends
every worker, and its workers do not outlive it when it is killed with
SIGKILL.

Every process of a run carries a tag in its environment, so the test finds
them all in /proc, wherever they were reparented; a process's end is
awaited on its pidfd, with a deadline.

    TETHER_TEST_BACKENDS=tensorpipe,grpc,libfabric   (default: tensorpipe)
    TETHER_TEST_ROUNDS=N                              (default: 1)

run each case on more backends, more times; every case prints its times
(pytest -s).
"""
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

import workers

TETHER_RUN = os.environ.get("TETHER_TEST_TETHER_RUN",
                            os.path.join(workers.REPO, "tools", "tether_run"))
TRAIN = os.environ.get("TETHER_TEST_TRAIN",
                       os.path.join(workers.REPO, "examples", "train"))
FAULT_WORKER = os.path.join(workers.HERE, "fault_worker.py")
TAG = "TETHER_LAUNCH_TEST_TAG"
NPROC = 3
BACKENDS = os.environ.get("TETHER_TEST_BACKENDS", "tensorpipe").split(",")
ROUNDS = int(os.environ.get("TETHER_TEST_ROUNDS", "1"))
# Loading torch and tether and forming the group, on a loaded machine.
START_BOUND_S = 120
# The C++ workers' peer timeout (RpcOptions::peer_timeout): how long a
# worker may take to find a peer lost that it is not calling (the parameter
# server, waiting in shutdown(), probes every second).
PEER_TIMEOUT_S = 2
# The bound of a Python worker's calls (fault_worker.py), longer than the
# survivors' bound: a call to a killed peer must fail at once, by its
# refused connection or its ended process, not by its timeout.
CALL_TIMEOUT_S = 30
# From the kill to every survivor's end: the peer timeout, then room for
# the process's exit on a loaded 2-core machine (a Python process with
# torch takes 0.3 to 3 s to finalize; torchrun looks at its workers every
# 5 s).
SURVIVORS_BOUND_S = {"cxx": PEER_TIMEOUT_S + 2, "python": PEER_TIMEOUT_S + 8}
# tether_run's grace between its SIGTERM and its SIGKILL.
GRACE_MS = 3000
# From the launcher's end to the end of anything it left.
LEFTOVER_BOUND_S = 5
# fault_worker.py's line (torchrun puts "[default0]:" before it).
READY = re.compile(r"ready (\d+) (\d+)$", re.M)


def tagged(tag):
    """The pids of the live processes whose environment carries `tag`."""
    needle = ("%s=%s" % (TAG, tag)).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue  # gone, or a zombie's
        if needle in environ:
            found.append(int(entry))
    return found


def describe(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return "%d %s" % (pid, f.read().replace(b"\0", b" ").decode())
    except OSError:
        return "%d (gone)" % pid


def wait_all(pidfds, deadline):
    """Waits until every process of {pid: pidfd} has ended or `deadline`
    (monotonic) passes; returns {pid: monotonic time of its end} for those
    that ended."""
    ended = {}
    while len(ended) < len(pidfds):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        waiting = [fd for pid, fd in pidfds.items() if pid not in ended]
        ready, _, _ = select.select(waiting, [], [], left)
        now = time.monotonic()
        for pid, fd in pidfds.items():
            if fd in ready:
                ended[pid] = now
    return ended


def open_pidfds(pids):
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            pass
    return fds


class Run:
    """A group of workers started in the background: by a launcher (one
    process, the launcher, started here) or by the test itself
    (launcher "none": the workers are the test's children, reaped only at
    the end, so a killed one stays a zombie meanwhile, as under a parent
    that looks late: torchrun's agent looks every 5 s)."""

    def __init__(self, launcher, kind, backend):
        self.launcher, self.kind, self.backend = launcher, kind, backend
        self.tag = uuid.uuid4().hex
        port = workers.free_port()
        # PYTHONUNBUFFERED: torchrun's --tee writes its workers' lines to its
        # own stdout, a pipe here, and never flushes it.
        env = workers.group_env(0, NPROC, port, backend,
                                {TAG: self.tag, "PYTHONUNBUFFERED": "1",
                                 "TETHER_TEST_CALL_TIMEOUT": str(CALL_TIMEOUT_S)})
        for key in ("RANK", "WORLD_SIZE"):
            del env[key]
        if kind == "python":
            program = [sys.executable, FAULT_WORKER]
        else:
            # Trainers step until stopped; a line every 5 steps shows they
            # run. The parameter server waits in shutdown() and finds a lost
            # trainer by its liveness probe.
            program = [TRAIN, "--backend=" + backend, "--steps=1000000",
                       "--progress_every=5",
                       "--peer_timeout_ms=%d" % (1000 * PEER_TIMEOUT_S)]
        commands = []  # (argv, env, prefix of its lines)
        if launcher == "tether_run":
            commands.append(([TETHER_RUN, "--nproc", str(NPROC),
                              "--grace_ms", str(GRACE_MS), "--"] + program,
                             env, ""))
        elif launcher == "torchrun":
            # --redirects 1 --tee 1: torch 1.13's torchrun on Python 3.11
            # fails to parse its default
            # (examples/run_training_launcher_test.sh).
            commands.append(([sys.executable, "-m", "torch.distributed.run",
                              "--nproc_per_node", str(NPROC),
                              "--master_addr", "127.0.0.1",
                              "--master_port", str(port),
                              "--redirects", "1", "--tee", "1",
                              "--no_python"] + program, env, ""))
        elif launcher == "spawn":
            assert kind == "python"
            commands.append(([sys.executable, FAULT_WORKER, "spawn",
                              str(NPROC)], env, ""))
        else:
            assert launcher == "none"
            for rank in range(NPROC):
                commands.append((program, dict(env, RANK=str(rank),
                                               WORLD_SIZE=str(NPROC)),
                                 "[%d] " % rank))
        self.lines = []
        self.changed = threading.Condition()
        self.procs, self.readers = [], []
        self.reading = len(commands)
        for argv, proc_env, prefix in commands:
            proc = subprocess.Popen(argv, env=proc_env,
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            reader = threading.Thread(target=self._read, args=(proc, prefix),
                                      daemon=True)
            reader.start()
            self.procs.append(proc)
            self.readers.append(reader)

    def _read(self, proc, prefix):
        for line in proc.stdout:
            with self.changed:
                self.lines.append(prefix + line)
                self.changed.notify_all()
        with self.changed:
            self.reading -= 1
            if self.reading == 0:
                self.lines.append(None)  # the end of the output
            self.changed.notify_all()

    def output(self):
        with self.changed:
            return "".join(line for line in self.lines if line is not None)

    def wait_for(self, done, timeout):
        """Waits until done(lines) is true; fails at the end of the output
        or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not done(self.lines):
                left = deadline - time.monotonic()
                if (self.lines and self.lines[-1] is None) or left <= 0:
                    raise AssertionError(
                        "%s never got going:\n%s" % (self.launcher,
                                                     self.output()))
                self.changed.wait(left)

    def worker_pids(self):
        """{rank: pid} once every worker runs: its "ready RANK PID" line
        (Python), or the trainers' first steps and the RANK of each tagged
        process running train (C++)."""
        if self.kind == "python":
            def ready(lines):
                return len(READY.findall("".join(l for l in lines if l))) \
                    >= NPROC
            self.wait_for(ready, START_BOUND_S)
            return {int(rank): int(pid)
                    for rank, pid in READY.findall(self.output())}

        def stepping(lines):
            text = "".join(l for l in lines if l)
            return all("trainer%d [" % r in text for r in range(1, NPROC))
        self.wait_for(stepping, START_BOUND_S)
        pids = {}
        for pid in tagged(self.tag):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if os.path.basename(f.read().split(b"\0")[0]) != b"train":
                        continue
                with open("/proc/%d/environ" % pid, "rb") as f:
                    environ = dict(e.split(b"=", 1)
                                   for e in f.read().split(b"\0") if b"=" in e)
            except OSError:
                continue
            pids[int(environ[b"RANK"])] = pid
        assert sorted(pids) == list(range(NPROC)), (pids, self.output())
        return pids

    def finish(self, timeout):
        """{pid: return code (None if it still runs)} of the processes the
        test started, once they have ended or after `timeout` seconds, and
        the output."""
        deadline = time.monotonic() + timeout
        codes = {}
        for proc in self.procs:
            try:
                codes[proc.pid] = proc.wait(max(0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[proc.pid] = None
        for reader in self.readers:
            reader.join(5)
        return codes, self.output()

    def kill_everything(self):
        for pid in tagged(self.tag) + [proc.pid for proc in self.procs]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            proc.wait()

    def leftovers(self, timeout):
        """What is left of the run `timeout` seconds from now at most (the
        processes still tagged once those found now have ended or the time
        is up)."""
        fds = open_pidfds(tagged(self.tag))
        try:
            wait_all(fds, time.monotonic() + timeout)
        finally:
            for fd in fds.values():
                os.close(fd)
        return [describe(pid) for pid in tagged(self.tag)]


LOST = re.compile(r"lost (\d+) at ([\d.]+) after")


def report(what, sent_at, pids, ended, launcher_took, status, out):
    """Prints one measurement: from the signal to each worker's end (and,
    for Python workers, to the moment it saw its call fail)."""
    learned = {int(rank): float(at) - sent_at for rank, at in LOST.findall(out)}
    print("%s: every worker ended within %.0f ms (%s); %s" % (
        what, 1000 * max(ended.values()),
        ", ".join("rank %d %.0f ms%s" % (
            rank, 1000 * ended[pid],
            " (its call failed at %.0f ms)" % (1000 * learned[rank])
            if rank in learned else "")
            for rank, pid in sorted(pids.items())),
        "the launcher in %.0f ms, status %s" % (1000 * launcher_took, status)
        if status is not None else "each with a non-zero status"))
    if os.environ.get("TETHER_TEST_VERBOSE"):
        print(out)


def signal_and_wait(run, target, sig, watched, bound):
    """Sends `sig` to the process `target` of `run` and waits for the
    processes {rank: pid} `watched` to end, then for the processes the test
    started; returns ({pid: seconds from the signal to its end}, seconds
    to the end of those the test started, {pid: their return code}, the
    output, what was left of the run, the signal's time.time())."""
    fds = open_pidfds(watched.values())
    assert len(fds) == len(watched), run.output()
    try:
        sent_at = time.time()
        sent = time.monotonic()
        os.kill(target, sig)
        ended = wait_all(fds, sent + bound)
    finally:
        for fd in fds.values():
            os.close(fd)
    codes, out = run.finish(bound + GRACE_MS / 1000.0)
    launcher_took = time.monotonic() - sent
    left = run.leftovers(LEFTOVER_BOUND_S)
    ended = {pid: at - sent for pid, at in ended.items()}
    return ended, launcher_took, codes, out, left, sent_at


def lose_a_worker(launcher, kind, backend, sig, victim=1):
    """Starts a group, sends `sig` to rank `victim` and checks how the rest
    end."""
    run = Run(launcher, kind, backend)
    try:
        pids = run.worker_pids()
        survivors = {rank: pid for rank, pid in pids.items() if rank != victim}
        ended, launcher_took, codes, out, left, sent_at = signal_and_wait(
            run, pids[victim], sig, survivors, SURVIVORS_BOUND_S[kind])
    finally:
        run.kill_everything()
    what = "%s, %s workers on %s, %s to rank %d" % (
        launcher, kind, backend, signal.Signals(sig).name, victim)
    still = [rank for rank, pid in survivors.items() if pid not in ended]
    assert not still, "%s: rank(s) %s still ran after %s s:\n%s" % (
        what, still, SURVIVORS_BOUND_S[kind], out)
    if launcher == "none":
        # The test's own children: each survivor failed on its own.
        status = None
        for rank, pid in survivors.items():
            assert codes[pid] not in (None, 0), (
                "%s: rank %d must fail (returned %s):\n%s"
                % (what, rank, codes[pid], out))
    else:
        [status] = codes.values()
        assert status not in (None, 0), (
            "%s: the launcher must fail (returned %s):\n%s"
            % (what, status, out))
    assert not left, "%s: left behind: %s\n%s" % (what, left, out)
    report(what, sent_at, survivors, ended, launcher_took, status, out)


def signal_tether_run(kind, sig):
    """Starts tether_run over a group and sends `sig` to tether_run: every
    worker must end (passed on, or with the launcher), and nothing be
    left."""
    run = Run("tether_run", kind, BACKENDS[0])
    try:
        pids = run.worker_pids()
        [launcher] = run.procs
        ended, launcher_took, codes, out, left, sent_at = signal_and_wait(
            run, launcher.pid, sig, pids, SURVIVORS_BOUND_S[kind])
    finally:
        run.kill_everything()
    what = "tether_run, %s workers on %s, %s to tether_run" % (
        kind, BACKENDS[0], signal.Signals(sig).name)
    still = [rank for rank, pid in pids.items() if pid not in ended]
    assert not still, "%s: rank(s) %s still ran after %s s:\n%s" % (
        what, still, SURVIVORS_BOUND_S[kind], out)
    want = -sig if sig == signal.SIGKILL else 128 + sig
    status = codes[launcher.pid]
    assert status == want, "%s: status %s, not %s:\n%s" % (
        what, status, want, out)
    assert not left, "%s: left behind: %s\n%s" % (what, left, out)
    report(what, sent_at, pids, ended, launcher_took, status, out)


# "none": the test starts the workers itself, and nothing stops the
# survivors but what they learn from tether.
CASES = [("none", "cxx"), ("none", "python"),
         ("tether_run", "cxx"), ("tether_run", "python"),
         ("torchrun", "python"), ("spawn", "python")]
FAULTS = [signal.SIGKILL, signal.SIGTERM]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sig", FAULTS, ids=[s.name for s in FAULTS])
@pytest.mark.parametrize("launcher,kind", CASES,
                         ids=["%s-%s" % case for case in CASES])
def test_a_lost_worker_ends_the_group(launcher, kind, sig, backend):
    for _ in range(ROUNDS):
        lose_a_worker(launcher, kind, backend, sig)


# SIGKILL: the workers die with tether_run (before PR_SET_PDEATHSIG,
# Python workers calling each other ran on for ever).
SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT]


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
@pytest.mark.parametrize("kind", ["cxx", "python"])
def test_tether_run_signalled(kind, sig):
    for _ in range(ROUNDS):
        signal_tether_run(kind, sig)
