"""Runs peer-suite tests one after another in this process and appends one
JSON line per test to a file, as each ends (peer_suite.run supervises it).

    /usr/bin/python3 -m peer_suite.driver OUT.jsonl Suite.test_name ...

Each test is the peer's MultiProcessTestCase: it forks `world_size`
workers and bounds them by DISTRIBUTED_TESTS_DEFAULT_TIMEOUT seconds.
"""
import json
import os
import sys
import time
import traceback
import unittest

from peer_suite import suites


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcome = "pass"
        self.detail = ""

    def addError(self, test, err):
        super().addError(test, err)
        self.outcome, self.detail = "fail", self._text(err)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcome, self.detail = "fail", self._text(err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcome, self.detail = "skip", str(reason)

    @staticmethod
    def _text(err):
        return "".join(traceback.format_exception(*err))


def main(out_path, names):
    with open(out_path, "a") as out:
        for name in names:
            suite, test = name.split(".", 1)
            # Tells the supervisor which test a hang belongs to.
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            started = time.monotonic()
            result = _Result()
            getattr(suites, suite)(test).run(result)
            out.write(json.dumps({
                "test": name, "outcome": result.outcome,
                "seconds": round(time.monotonic() - started, 2),
                "detail": result.detail}) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
    # Not a normal exit: multiprocessing's exit handler would wait for a
    # test's worker that outlived its test (the supervisor kills those).
    sys.stdout.flush()
    os._exit(0)
