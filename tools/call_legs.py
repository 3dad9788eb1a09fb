#!/usr/bin/env python3
"""call_legs: where the wall time of a small rpc_sync goes, leg by leg.

Runs tools/rpc_latency (two processes under tools/tether_run, rank 0 calling
rank 1 in a loop) and, while the calls run, records the system calls that
bound each leg of a round trip with the kernel's tracepoints
(`perf record -a -e syscalls:...`, so it needs perf and the right to trace
the whole machine). Each round trip is then cut at its system calls:

    caller: answer read -> next request's sendmsg   (decode, complete, encode)
    caller: sendmsg                                 (the kernel's TCP send)
    hop to the callee: sendmsg returned -> callee's epoll_wait returned
    callee: epoll_wait returned -> recvfrom
    callee: request read -> answer's sendmsg        (pipe, decode, operator,
                                                     encode)
    callee: sendmsg
    hop back: sendmsg returned -> caller's poll returned
    caller: poll returned -> recvfrom

    bazel build -c opt //tools:tether_run //tools:rpc_latency
    tools/call_legs.py --bin_dir bazel-out/k8-opt/bin [--variant negotiated]

Prints each leg's quartiles in microseconds (the tracepoints' clock has
microsecond resolution, and tracing adds about a microsecond per system
call). Meaningful only on a quiet machine: under load the pollers sleep.
"""
import argparse
import collections
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

EVENTS = ("sys_enter_sendmsg", "sys_exit_sendmsg", "sys_enter_recvfrom",
          "sys_exit_recvfrom", "sys_exit_epoll_wait", "sys_exit_poll")

LEGS = (
    ("caller: answer read -> next request's sendmsg", "caller_work"),
    ("caller: sendmsg", "caller_send"),
    ("hop to the callee: sendmsg returned -> its wait returned", "hop_out"),
    ("callee: wait returned -> recvfrom", "callee_wake"),
    ("callee: request read -> answer's sendmsg", "callee_work"),
    ("callee: sendmsg", "callee_send"),
    ("hop back: sendmsg returned -> caller's wait returned", "hop_back"),
    ("caller: wait returned -> recvfrom", "caller_wake"),
)

LINE = re.compile(r"^\s*(\d+)/(\d+)\s+([\d.]+):\s+syscalls:(\w+):\s*(.*)$")


def parse(lines):
    """(time in us, pid, tid, event, argument text) of each traced event."""
    events = []
    for line in lines:
        m = LINE.match(line)
        if m and m.group(4) in EVENTS:
            events.append((float(m.group(3)) * 1e6, int(m.group(1)),
                           int(m.group(2)), m.group(4), m.group(5).strip()))
    return events


def split_legs(events):
    """Each leg's samples (us), from the events of the two busiest processes.

    The caller is the process whose requests leave from its main thread
    (rpc_sync writes on the calling thread); a wait counts only when it
    returned something ready.
    """
    busiest = [p for p, _ in
               collections.Counter(e[1] for e in events).most_common(2)]
    if len(busiest) < 2:
        raise ValueError("the trace holds fewer than two processes")
    callers = {e[1] for e in events
               if e[3] == "sys_enter_sendmsg" and e[1] == e[2]
               and e[1] in busiest}
    if len(callers) != 1:
        raise ValueError("cannot tell the caller: %d processes send from "
                         "their main thread" % len(callers))
    caller = callers.pop()
    legs = {key: [] for _, key in LEGS}
    last = {}  # (side, mark) -> time

    def since(side, mark, now, leg):
        start = last.pop((side, mark), None)
        if start is not None:
            legs[leg].append(now - start)

    for t, pid, _, event, arg in events:
        if pid not in busiest:
            continue
        side, other = ("caller", "callee") if pid == caller else ("callee",
                                                                 "caller")
        if event == "sys_enter_sendmsg":
            since(side, "read", t, side + "_work")
            last[(side, "send")] = t
        elif event == "sys_exit_sendmsg":
            since(side, "send", t, side + "_send")
            last[(side, "sent")] = t
        elif event in ("sys_exit_epoll_wait", "sys_exit_poll"):
            if arg in ("0x0", "0") or arg.startswith("0xffff"):
                continue
            since(other, "sent", t, "hop_out" if side == "callee" else
                  "hop_back")
            last[(side, "woke")] = t
        elif event == "sys_enter_recvfrom":
            since(side, "woke", t, side + "_wake")
        elif event == "sys_exit_recvfrom":
            last[(side, "read")] = t
    return legs


def quartiles(samples):
    if len(samples) < 4:
        return None
    q = statistics.quantiles(samples, n=4)
    return q[0], statistics.median(samples), q[2]


def report(legs, out=sys.stdout):
    print("%-58s %7s %6s %6s %6s" % ("leg", "n", "p25", "p50", "p75"),
          file=out)
    total = 0.0
    for label, key in LEGS:
        q = quartiles(legs[key])
        if q is None:
            print("%-58s %7d %6s %6s %6s" % (label, len(legs[key]), "-", "-",
                                             "-"), file=out)
            continue
        total += q[1]
        print("%-58s %7d %6.1f %6.1f %6.1f" % ((label, len(legs[key])) + q),
              file=out)
    print("%-58s %7s %6s %6.1f" % ("sum of the medians", "", "", total),
          file=out)


def record(args, trace_path):
    """Runs the calls and traces them; returns perf script's text."""
    tether_run = os.path.join(args.bin_dir, "tools", "tether_run")
    rpc_latency = os.path.join(args.bin_dir, "tools", "rpc_latency")
    port = 21000 + random.randrange(20000)
    calls = subprocess.Popen(
        [tether_run, "--nproc", "2", "--master_port", str(port), "--",
         rpc_latency, "--calls=%d" % args.calls,
         "--variants=%s" % args.variant],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(args.delay)
        if calls.poll() is not None:
            raise RuntimeError("rpc_latency ended before the trace: "
                               + calls.stdout.read())
        subprocess.run(
            ["perf", "record", "-a", "-q", "-o", trace_path] +
            [arg for e in EVENTS for arg in ("-e", "syscalls:" + e)] +
            ["--", "sleep", str(args.seconds)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if calls.poll() is not None:
            raise RuntimeError("rpc_latency ended during the trace; give "
                               "more --calls")
    finally:
        output, _ = calls.communicate()
    json_lines = [l for l in output.splitlines() if "JSON" in l]
    if json_lines:
        print(json_lines[-1].split("JSON", 1)[1].strip())
    return subprocess.run(
        ["perf", "script", "-i", trace_path, "-F", "pid,tid,time,event,trace"],
        check=True, capture_output=True, text=True).stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", default="bazel-bin")
    parser.add_argument("--variant", default="negotiated",
                        help="rpc_latency's --variants word")
    parser.add_argument("--calls", type=int, default=100000)
    parser.add_argument("--delay", type=float, default=3.0,
                        help="seconds from launch to the trace's start")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="how long the trace lasts")
    parser.add_argument("--trace", help="a saved `perf script -F "
                        "pid,tid,time,event,trace` text to split instead")
    args = parser.parse_args(argv)
    if args.trace:
        with open(args.trace) as f:
            text = f.read()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            text = record(args, os.path.join(tmp, "trace.data"))
    try:
        legs = split_legs(parse(text.splitlines()))
    except ValueError as e:
        print("call_legs: %s" % e, file=sys.stderr)
        return 2
    report(legs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
