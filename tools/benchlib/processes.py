"""Finding the tools' binaries and running them.

A tool runs in its own process group, bounded by a timeout; a two-process
tool runs under tether_run --nproc 2 (with --hosts, on_hosts.sh: one rank
per simulated host, tools/benchlib/hosts.py) and prints, from rank 0, one
line `JSON {...}` (parse_json_line), or its record says why it has none.
"""
import json
import os
import re
import signal
import subprocess

# The folder of tools/bench.py, peer_bench.py and the tools' sources:
# this package's parent.
TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def workspace_dir():
    return os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.path.dirname(
        TOOLS_DIR)


def search_dirs(args):
    """Where binaries may be: --bin_dir, runfiles, the workspace's bazel-bin."""
    dirs = []
    if args.bin_dir:
        dirs.append(args.bin_dir)
    # Under `bazel run` the tools are in <runfiles>/tether/tools.
    if os.path.basename(os.path.dirname(TOOLS_DIR)) == "tether":
        dirs.append(os.path.dirname(TOOLS_DIR))
    runfiles = os.environ.get("RUNFILES_DIR")
    if runfiles:
        dirs.append(os.path.join(runfiles, "tether"))
    dirs.append(os.path.join(workspace_dir(), "bazel-bin"))
    return dirs


def find_binary(args, relative):
    for d in search_dirs(args):
        path = os.path.join(d, relative)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None




def run(command, timeout, env=None):
    """(returncode or None on timeout, stdout, stderr) of `command`, run in
    its own process group so that a timeout stops all of it."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return None, out, err


JSON_LINE = re.compile(r"^(?:\[0\] )?JSON (\{.*\})\s*$")


def parse_json_line(text):
    """The object of the last `JSON {...}` line (rank 0's under tether_run)."""
    found = None
    for line in text.splitlines():
        m = JSON_LINE.match(line)
        if m:
            found = json.loads(m.group(1))
    return found


def tail(text, lines=3):
    return " | ".join(t.strip() for t in text.strip().splitlines()[-lines:])


def run_two_process(args, argv, timeout, env=None):
    """bench_worker-style program under args.launcher (tether_run --nproc
    2, or one rank per host): its JSON."""
    command = args.launcher(timeout) + argv
    code, out, err = run(command, timeout, env)
    result = parse_json_line(out)
    if result is None:
        why = "timed out after %d s" % timeout if code is None else (
            "exit %s, no JSON: %s" % (code, tail(err + out)))
        result = {"status": "failed: " + why}
    return result


def common_args(args):
    """What every two-process tool gets: --quick, --max_bytes."""
    extra = ["--quick"] if args.quick else []
    if args.max_bytes:
        extra.append("--max_bytes=%d" % args.max_bytes)
    return extra


def short(status):
    return status if len(status) < 60 else status[:57] + "..."
