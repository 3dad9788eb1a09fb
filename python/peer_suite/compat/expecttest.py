"""The part of the `expecttest` package that torch's test helpers use.

Debian's python3-torch imports `expecttest` in
torch/testing/_internal/common_utils.py, but Debian packages no
`expecttest`. peer_suite puts this folder on sys.path only when the real
package is absent. It has the real one's interface for what the RPC suites
reach: `ACCEPT` and `TestCase.assertExpectedInline`, which compares the
dedented expectation with the actual text; it cannot rewrite the test file
(the real package's accept mode), so ACCEPT stays False.
"""
import textwrap
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):
        expect = textwrap.dedent(expect).strip("\n")
        self.assertMultiLineEqual(expect, actual.strip("\n"))
