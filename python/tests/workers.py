"""Starts real worker processes on loopback for the Python tests."""
import contextlib
import os
import random
import socket
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

BACKENDS = ["tensorpipe", "grpc", "libfabric"]


def _bind(port):
    """The loopback TCP port a socket bound to `port` gets, or None."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return s.getsockname()[1]


def free_port():
    """A loopback TCP port nothing is bound to now, for a rendezvous store
    that names its port before the process serving it binds it.

    Chosen at random below the kernel's ephemeral range: servers binding
    port 0 and outgoing connections take theirs from that range, so none of
    them can take this port between the pick and the bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            end = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        end = 32768
    first = 10000
    if end - first >= 1000:
        rng = random.SystemRandom()
        for _ in range(100):
            port = _bind(rng.randrange(first, end))
            if port:
                return port
    return _bind(0)


def group_env(rank, world_size, port, backend, extra=None):
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               RANK=str(rank), WORLD_SIZE=str(world_size),
               TETHER_BACKEND=backend)
    env["PYTHONPATH"] = os.pathsep.join(
        [HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra or {})
    return env


def spawn(argv, env):
    return subprocess.Popen([sys.executable] + list(argv), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def read_until(proc, text, timeout=60):
    """Reads `proc`'s output until a line contains `text`; returns what it
    read (which finish() then leaves out). Fails after `timeout` seconds or
    at the end of the output."""
    lines = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines or text not in lines[-1]:
        proc.kill()
        raise AssertionError("no line with %r within %s s: %s"
                             % (text, timeout, "".join(lines)))
    return "".join(lines)


def finish(procs, timeout=120):
    """Waits for every process; returns their (returncode, output). A
    process still running after `timeout` seconds is killed and reported."""
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += "\n[killed after %s s]" % timeout
        results.append((proc.returncode, out))
    return results


def run_group(script, world_size, backend, args_for_rank=None, extra_env=None,
              timeout=120):
    """Runs `script` as every rank of a group; returns [(rc, output)]."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        args = args_for_rank(rank) if args_for_rank else []
        procs.append(spawn([script] + args,
                           group_env(rank, world_size, port, backend,
                                     extra_env)))
    return finish(procs, timeout)


@contextlib.contextmanager
def with_callee(backend, allowed):
    """This process joins as "caller" (rank 0) with callee.py as "callee"
    (rank 1), both allowing the modules `allowed`; yields "callee", then
    shuts the group down and checks that the callee exited cleanly."""
    import tether.rpc as rpc
    port = free_port()
    init = "tcp://127.0.0.1:%d" % port
    proc = spawn([os.path.join(HERE, "callee.py"), init] + list(allowed),
                 group_env(1, 2, port, backend))
    rpc.init_rpc("caller", backend=backend, rank=0, world_size=2,
                 rpc_backend_options=rpc.RpcBackendOptions(
                     init_method=init, allowed_modules=list(allowed)))
    yield "callee"
    rpc.shutdown()
    [(rc, out)] = finish([proc])
    assert rc == 0, out


if __name__ == "__main__":
    # `python3 workers.py`: prints a free port (free_port), for shell tests.
    print(free_port())
