"""Runs the peer's RPC test suites against tether and reports.

    /usr/bin/python3 -m peer_suite.run [--suite NAME ...] [--only FILE]
        [--backend tensorpipe] [--timeout 45] [--jobs 1]
        [--markdown docs/peer_suite.md] [--json results.json]

Every test of the selected suites (peer_suite.suites.SUITES) that
peer_suite.exclusions does not exclude runs in a driver process
(peer_suite.driver), each with `--timeout` seconds: the peer's
MultiProcessTestCase kills its workers then, and a driver silent for longer
is killed here and restarted after the hung test, so one hang cannot stall
the run. The report counts pass / fail / excluded / skipped per suite,
gives each excluded group's reason and groups failures by cause. Exit
status: 0 when every test run passed (or was skipped), 1 otherwise.
"""
import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
# The supervisor's grace beyond the per-test timeout (the peer's harness
# asks the workers for tracebacks before it kills them).
GRACE_SECONDS = 30


def select(suites, only):
    """[(suite, test, exclusion or None)] in the suites' order."""
    from peer_suite import exclusions, suites as peer
    chosen = []
    loader = unittest.TestLoader()
    for name in suites:
        cls = getattr(peer, "Tether" + name)
        for test in loader.getTestCaseNames(cls):
            key = "Tether%s.%s" % (name, test)
            if only is not None and key not in only:
                continue
            chosen.append((name, test, exclusions.reason_for(cls, test)))
    return chosen


def _driver_env(backend, timeout):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PYTHON_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                        if p])
    env["TETHER_BACKEND"] = backend
    env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_tests(keys, backend, timeout, log):
    """Runs `keys` ("TetherSuite.test") in drivers; {key: result dict}."""
    results = {}
    remaining = list(keys)
    env = _driver_env(backend, timeout)
    with tempfile.TemporaryDirectory(prefix="peer_suite") as tmp:
        out_path = os.path.join(tmp, "results.jsonl")
        while remaining:
            open(out_path, "w").close()
            driver = subprocess.Popen(
                [sys.executable, "-m", "peer_suite.driver", out_path]
                + remaining, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=tmp)
            try:
                current = _follow(driver, out_path, results, timeout)
            finally:
                # Interrupted, or workers that outlived their test: no
                # orphans.
                try:
                    os.killpg(driver.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                driver.wait()
            if current is not None:
                results[current] = {
                    "test": current, "outcome": "fail", "seconds": None,
                    "detail": "peer_suite: the test was still running after "
                              "%d s (hung), or its driver died; killed"
                              % (timeout + GRACE_SECONDS)}
                print("fail   hung   %s" % current, flush=True)
            remaining = [k for k in remaining if k not in results]
    return results


def _follow(driver, out_path, results, timeout):
    """Reads the driver's results as they come; kills it when it is silent
    past the timeout. Returns the test it was running when it ended, if
    any."""
    current, last_change, seen = None, time.monotonic(), 0
    while True:
        try:
            driver.wait(timeout=1)
            exited = True
        except subprocess.TimeoutExpired:
            exited = False
        with open(out_path) as f:
            lines = f.read().splitlines()
        for line in lines[seen:]:
            if not line.endswith("}"):
                break  # a line still being written
            seen += 1
            record = json.loads(line)
            if "start" in record:
                current = record["start"]
            else:
                results[record["test"]] = record
                current = None
                print("%-5s %6.1fs %s" % (
                    record["outcome"], record["seconds"],
                    record["test"]), flush=True)
            last_change = time.monotonic()
        if exited:
            break
        if time.monotonic() - last_change > timeout + GRACE_SECONDS:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            break
    return current


_EXCEPTION_LINE = re.compile(
    r"^([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception|Exit|Interrupt)|"
    r"AssertionError)\b:?(.*)$")


def cause_of(detail):
    """A short text that groups failures with the same cause: the first
    worker's last exception line, with numbers and names blurred."""
    lines = detail.splitlines()
    # The peer's harness prints each failed worker's traceback after
    # "Process N exited with error code 10 and exception:".
    for i, line in enumerate(lines):
        if "exited with error code" in line:
            lines = lines[i + 1:]
            end = next((j for j, l in enumerate(lines)
                        if "exited with error code" in l), len(lines))
            lines = lines[:end]
            break
    candidates = [l.strip() for l in lines if _EXCEPTION_LINE.match(
        l.strip())]
    text = candidates[-1] if candidates else (
        lines[-1].strip() if lines else "no output")
    if "still running after" in detail:
        text = "hung: still running after the timeout"
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    text = re.sub(r"0xN[0-9a-f]*", "0x…", text)
    return text[:160]


def report(chosen, results, args, elapsed):
    per_suite = collections.OrderedDict()
    excluded = collections.defaultdict(list)
    failures = collections.defaultdict(list)
    from peer_suite import exclusions
    for suite, test, exclusion in chosen:
        counts = per_suite.setdefault(suite, collections.Counter())
        key = "Tether%s.%s" % (suite, test)
        if exclusion is not None:
            counts["excluded"] += 1
            excluded[exclusion[0]].append((suite, test, exclusion[1]))
            continue
        result = results[key]
        counts[result["outcome"]] += 1
        if result["outcome"] == "fail":
            failures[cause_of(result["detail"])].append((suite, test))
    total = collections.Counter()
    for counts in per_suite.values():
        total.update(counts)
    out = []
    out.append("| suite | pass | fail | skipped | excluded | total |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for suite, counts in list(per_suite.items()) + [("**all**", total)]:
        out.append("| %s | %d | %d | %d | %d | %d |" % (
            suite, counts["pass"], counts["fail"], counts["skip"],
            counts["excluded"], sum(counts.values())))
    out.append("")
    out.append("Backend %s, per-test timeout %d s, %.0f s in all." % (
        args.backend, args.timeout, elapsed))
    out.append("")
    out.append("### Excluded, by group")
    for group, tests in sorted(excluded.items(), key=lambda kv: -len(kv[1])):
        out.append("")
        out.append("**%s** (%d): %s." % (group, len(tests),
                                       exclusions.REASONS[group]))
        out.append("")
        out.append(", ".join(
            "`%s.%s` (%s)" % (s, t, ", ".join(why)) for s, t, why in tests))
    out.append("")
    out.append("### Failures, by cause")
    for cause, tests in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        out.append("")
        out.append("- %d: `%s`" % (len(tests), cause.replace("`", "'")))
        out.append("  " + ", ".join("`%s.%s`" % st for st in tests))
    return "\n".join(out) + "\n"


def main(argv=None):
    from peer_suite import suites as peer
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", action="append",
                        choices=sorted(peer.SUITES),
                        help="a suite to run (default: all)")
    parser.add_argument("--only", help="a file naming the tests to run, "
                        "one TetherSuite.test a line")
    parser.add_argument("--backend", default="tensorpipe")
    parser.add_argument("--timeout", type=int, default=45,
                        help="seconds each test may take")
    parser.add_argument("--markdown", help="write the report here")
    parser.add_argument("--json", help="write every result here")
    parser.add_argument("--log", help="write the workers' output here "
                        "(default: dropped)")
    parser.add_argument("--list", action="store_true",
                        help="print what would run and what is excluded")
    args = parser.parse_args(argv)
    only = None
    if args.only:
        with open(args.only) as f:
            only = {l.split("#")[0].strip() for l in f} - {""}
    chosen = select(args.suite or list(peer.SUITES), only)
    if only is not None:
        missing = only - {"Tether%s.%s" % (s, t) for s, t, _ in chosen}
        if missing:
            parser.error("no such tests: %s" % ", ".join(sorted(missing)))
    if args.list:
        for suite, test, exclusion in chosen:
            print("Tether%s.%s%s" % (suite, test, "" if exclusion is None
                                     else "  EXCLUDED %s %s" % exclusion))
        return 0
    keys = ["Tether%s.%s" % (s, t) for s, t, e in chosen if e is None]
    started = time.monotonic()
    with (open(args.log, "w") if args.log else
          tempfile.TemporaryFile("w+")) as log:
        results = run_tests(keys, args.backend, args.timeout, log)
    text = report(chosen, results, args, time.monotonic() - started)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    return 0 if all(r["outcome"] != "fail" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
