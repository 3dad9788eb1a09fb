"""A worker that calls its peers in a loop, for launchers_test.py.

    python3 fault_worker.py            (under tether_run or torchrun: RANK,
                                        WORLD_SIZE, MASTER_ADDR/PORT set)
    python3 fault_worker.py spawn N    (starts N workers itself with
                                        torch.multiprocessing.spawn;
                                        MASTER_ADDR/PORT set)

Each worker joins the group (backend: TETHER_BACKEND), prints
"ready RANK PID" and then calls every other worker in turn, a small tensor
each way, until a call fails: it prints "lost RANK at TIME after N calls:
ERROR" (TIME: time.time()) and raises (exit status 1; under spawn, the
parent's exception names it). A call is bounded by TETHER_TEST_CALL_TIMEOUT
seconds (default 10): a killed peer fails a call at once, by its refused
connection.
"""
import os
import sys
import time

import torch


def say(line):
    # One write: the workers of spawn share the parent's stdout, and print()
    # writes the line and its end apart.
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def run(rank, world_size):
    import tether.rpc as rpc
    timeout = float(os.environ.get("TETHER_TEST_CALL_TIMEOUT", "10"))
    rpc.init_rpc("worker%d" % rank, rank=rank, world_size=world_size,
                 rpc_backend_options=rpc.RpcBackendOptions(
                     rpc_timeout=timeout))
    say("ready %d %d" % (rank, os.getpid()))
    peers = ["worker%d" % r for r in range(world_size) if r != rank]
    x = torch.ones(4)
    calls = 0
    try:
        while True:
            for peer in peers:
                x = rpc.rpc_sync(peer, torch.add, args=(x, 1))
                calls += 1
            time.sleep(0.01)  # not a busy loop: the machine is shared
    except Exception as e:  # noqa: BLE001 - any failure is the peer's loss
        say("lost %d at %.3f after %d calls: %s"
            % (rank, time.time(), calls, str(e).splitlines()[0]))
        raise RuntimeError("worker%d lost a peer" % rank) from e


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "spawn":
        import torch.multiprocessing as mp
        world_size = int(sys.argv[2])
        mp.spawn(run, args=(world_size,), nprocs=world_size, join=True)
    else:
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


if __name__ == "__main__":
    main()
