"""examples/python/elastic_ps.py under tether_run --max_restarts 2
--elastic: trainer1 is killed with SIGKILL once it has logged a random
step; tether_run starts it again alone, it rejoins the running group under
its old name and resumes from its own last checkpoint, while the parameter
server and trainer2 never stop. The job finishes every step."""
import os
import random
import re
import signal
import subprocess
import tempfile
import time

import workers

TETHER_RUN = os.path.join(workers.REPO, "tools", "tether_run")
PROGRAM = os.path.join(workers.REPO, "examples", "python", "elastic_ps.py")
STEPS = 120
EVERY = 10
TIMEOUT = 120


def last_steps(path):
    """The last step each process has logged: {name: step}."""
    last = {}
    try:
        with open(path) as f:
            for line in f:
                fields = line.split()
                if len(fields) == 4:
                    last[fields[0]] = max(last.get(fields[0], 0),
                                          int(fields[1]))
    except FileNotFoundError:
        pass
    return last


def test_trainer_killed_rejoins_while_the_others_run_on():
    # trainer1 also saves the server's checkpoints, so it runs behind
    # trainer2; on a loaded machine far behind. It is killed at kill_at, or
    # earlier (past its first checkpoint) once trainer2 is half done, so
    # that trainer2 still has steps to run while trainer1 is down.
    kill_at = int(os.environ.get("KILL_AT", random.randint(15, 60)))
    print("trainer1 is killed once it has logged step %d, or earlier when "
          "trainer2 is half done (KILL_AT=%d reproduces)" % (kill_at, kill_at))
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    loss_log = os.path.join(tmp, "loss.log")
    out_path = os.path.join(tmp, "out")
    with open(out_path, "w") as out:
        job = subprocess.Popen(
            [TETHER_RUN, "--nproc", "3", "--max_restarts", "2", "--elastic",
             "--", "/usr/bin/python3", PROGRAM, "--steps", str(STEPS),
             "--checkpoint_dir", os.path.join(tmp, "ckpt"),
             "--checkpoint_every", str(EVERY), "--loss_log", loss_log],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            last = last_steps(loss_log)
            trainer1 = last.get("trainer1", 0)
            if trainer1 >= kill_at or (trainer1 > EVERY and
                                       last.get("trainer2", 0) >= STEPS // 2):
                break
            assert job.poll() is None, open(out_path).read()
            assert time.monotonic() < deadline, open(out_path).read()
            time.sleep(0.02)
        text = open(out_path).read()
        pid = int(re.search(r"trainer1: rank 1 of 3, pid (\d+)", text).group(1))
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        status = job.wait(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    text = open(out_path).read()
    print(text)
    assert status == 0, text
    assert re.search(r"tether_run: restart 1 of 2: rank 1 killed by signal 9 "
                     r"\(Killed\); starting rank 1 alone again", text), text
    assert len(re.findall(r"parameter_server: rank 0 of 3", text)) == 1, text
    assert len(re.findall(r"trainer2: rank 2 of 3", text)) == 1, text
    assert len(re.findall(r"trainer1: rank 1 of 3", text)) == 2, text
    resumed = re.search(r"trainer1: rejoined, resumed from the checkpoint of "
                        r"step (\d+)", text)
    assert resumed, text
    resumed_at = int(resumed.group(1))
    assert "parameter_server: every trainer is done" in text, text
    lines = [line.split() for line in open(loss_log)]
    # The last step trainer1 logged before the kill landed; its checkpoint
    # of the step before that multiple of EVERY may have been cut short.
    killed_after = max(int(s) for n, s, _, t in lines
                       if n == "trainer1" and float(t) <= killed)
    assert ((killed_after // EVERY - 1) * EVERY <= resumed_at
            <= killed_after), (killed_after, text)
    for name in ("trainer1", "trainer2"):
        steps = sorted({int(s) for n, s, _, _ in lines if n == name})
        assert steps == list(range(1, STEPS + 1)), (name, steps)
    # When trainer1 trained again, and what trainer2 did meanwhile.
    back = min(float(t) for n, _, _, t in lines
               if n == "trainer1" and float(t) > killed)
    during = sum(1 for n, _, _, t in lines
                 if n == "trainer2" and killed < float(t) <= back)
    print("trainer1 trained again %.2f s after the kill, from step %d "
          "(killed after step %d); trainer2 ran %d steps meanwhile"
          % (back - killed, resumed_at + 1, killed_after, during))
    assert during > 0, "trainer2 stood still while trainer1 was down"
