"""A worker of a dynamic group (no world size anywhere, as the peer's
programs start one): `dynamic_group.py NAME RANK`. w0 starts the group, sees
w1 join, calls it, sees it leave and that a call to it then fails naming
it; w1 joins, calls w0, waits to be called, and leaves."""
import sys
import threading
import time

import torch

import tether.rpc as rpc

called = threading.Event()


def mark():
    called.set()
    return rpc.get_worker_info().name


def names():
    return sorted(info.name for info in rpc.get_all_worker_infos())


def wait_for(condition, what, seconds=60):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            sys.exit("gave up waiting for " + what)
        time.sleep(0.02)


name, rank = sys.argv[1], int(sys.argv[2])
rpc.init_rpc(name, rank=rank)
if name == "w0":
    print("group at start", names(), flush=True)
    wait_for(lambda: "w1" in names(), "w1 to join")
    print("called w1:", rpc.rpc_sync("w1", mark), flush=True)
    wait_for(lambda: "w1" not in names(), "w1 to leave")
    try:
        rpc.rpc_sync("w1", mark)
        print("a call to w1 after it left succeeded", flush=True)
    except RuntimeError as error:
        print("after leave:", error, flush=True)
else:
    print("group at join", names(), flush=True)
    print("sum", rpc.rpc_sync("w0", torch.add,
                              args=(torch.ones(2), 1)).tolist(), flush=True)
    if not called.wait(60):
        sys.exit("w0 never called")
rpc.shutdown()
print(name, "done", flush=True)
