"""shutdown(timeout=) bounds the graceful wait for a peer that is alive.

    python3 shutdown_timeout.py RANK   (MASTER_ADDR/PORT, WORLD_SIZE=2)

Rank 0 shuts down gracefully with a 1 s bound while rank 1 (alive, busy)
joins only after rank 0 has given up: rank 0 prints what it raised.
"""
import sys
import time

import tether.rpc as rpc

rank = int(sys.argv[1])
rpc.init_rpc("worker%d" % rank, rank=rank, world_size=2)
if rank == 0:
    try:
        rpc.shutdown(graceful=True, timeout=1)
        print("shutdown returned")
    except RuntimeError as e:
        print("shutdown raised %s: %s" % (type(e).__name__, e))
    # Stopped all the same: a call now fails.
    try:
        rpc.rpc_sync("worker1", min, args=(1, 2))
        print("call after shutdown ran")
    except RuntimeError as e:
        print("call after shutdown raised")
else:
    # Wait until rank 0 has given up (its worker is gone), then leave.
    while True:
        try:
            rpc.rpc_sync("worker0", min, args=(1, 2), timeout=5)
            time.sleep(0.2)
        except RuntimeError:
            break
    rpc.shutdown(graceful=False)
    print("rank 1 done")
