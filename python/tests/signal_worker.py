"""A worker process for signals_test.py.

    python3 signal_worker.py dispositions     (one worker; MASTER_ADDR/PORT,
                                               TETHER_BACKEND)
    python3 signal_worker.py busy RANK        (two workers, WORLD_SIZE=2)
    python3 signal_worker.py abort RANK       (two workers, WORLD_SIZE=2)

dispositions: prints a line "STAGE JSON" at each stage (start; after
`import torch`; after `import tether.rpc`; after init_rpc and a call;
after shutdown) with every signal's disposition as sigaction reports it,
the kernel's caught and ignored sets, and whether libfabric is mapped.

busy: rank 0 calls rank 1's `wait_forever` from its main thread while
rank 1 calls rank 0's `spin`, which prints "spinning" and computes in
Python for ever on one of rank 0's pool threads. The test then sends
SIGTERM to rank 0.

abort: rank 1 calls rank 0's `crash`, which calls os.abort().
"""
import ctypes
import json
import os
import sys
import time

_libc = ctypes.CDLL(None, use_errno=True)
_SA_RESTORER = 0x04000000
_SA_FLAGS_OFFSET = 8 + 128  # after sa_handler and sa_mask (x86-64 glibc)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _describe(handler):
    if handler == 0:
        return "default"
    if handler == 1:
        return "ignored"
    info = _DlInfo()
    where = ""
    if _libc.dladdr(ctypes.c_void_p(handler), ctypes.byref(info)) and \
            info.dli_fname:
        where = " in " + os.path.basename(info.dli_fname.decode())
    return "handler 0x%x%s" % (handler, where)


def dispositions():
    """{signal: description} for every signal sigaction reports on (glibc
    refuses its own 32 and 33)."""
    result = {}
    for signal in range(1, 65):
        action = ctypes.create_string_buffer(256)
        if _libc.sigaction(signal, None, action) != 0:
            continue
        handler = ctypes.c_void_p.from_buffer(action).value or 0
        text = _describe(handler)
        if handler > 1:
            flags = ctypes.c_int.from_buffer(action, _SA_FLAGS_OFFSET).value
            text += " flags 0x%x" % (flags & ~_SA_RESTORER)
        result[signal] = text
    return result


def proc_sets():
    sets = {}
    with open("/proc/self/status") as status:
        for line in status:
            key = line.split(":")[0]
            if key in ("SigCgt", "SigIgn"):
                mask = int(line.split()[1], 16)
                sets[key] = [s for s in range(1, 65)
                             if mask >> (s - 1) & 1 and s not in (32, 33)]
    return sets


def libfabric_mapped():
    with open("/proc/self/maps") as maps:
        return any(os.path.basename(line.split()[-1]).startswith("libfabric.so.1")
                   for line in maps if "/" in line)


def report(stage):
    print(stage, json.dumps({"dispositions": dispositions(),
                             "proc": proc_sets(),
                             "libfabric": libfabric_mapped()}), flush=True)


def spin():
    print("spinning", flush=True)
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003


def wait_forever():
    while True:
        time.sleep(1)


def crash():
    print("crashing", flush=True)
    os.abort()


def main():
    mode = sys.argv[1]
    if mode == "dispositions":
        report("start")
        import torch
        report("torch")
        import tether.rpc as rpc
        report("import")
        rpc.init_rpc("worker0", rank=0, world_size=1)
        total = rpc.rpc_sync("worker0", torch.add,
                             args=(torch.ones(1 << 20), torch.ones(1 << 20)))
        assert total.sum().item() == 2 << 20
        report("init")
        rpc.shutdown()
        report("shutdown")
        return
    import tether.rpc as rpc
    rank = int(sys.argv[2])
    rpc.init_rpc("worker%d" % rank, rank=rank, world_size=2)
    if mode == "busy":
        if rank == 0:
            rpc.rpc_sync("worker1", wait_forever, timeout=0)
        else:
            rpc.rpc_async("worker0", spin, timeout=0)
            wait_forever()
    elif mode == "abort":
        if rank == 1:
            rpc.rpc_async("worker0", crash, timeout=0)
        wait_forever()
    print("returned", flush=True)


if __name__ == "__main__":
    main()
