"""Tests of check_markers.py on small trees made for each test: every kind
of work-period marker is found at its line, in documents and in sources,
also when a line break splits it; what is not one is left alone.

The markers below are built from pieces ("issue " + "#16"), so that this
file, which the check also reads, holds none itself."""
import io
import os
import tempfile
import unittest
from contextlib import redirect_stdout

from docs import check_markers

HASH = "#"
ISSUE = "issue " + HASH + "16"
SESSION = "session " + "14"


class MarkersTest(unittest.TestCase):

    def found(self, text):
        return [marker for _, marker in check_markers.markers(text)]

    def test_each_kind_of_marker_is_found(self):
        for marker in (ISSUE, "Issue " + HASH + "9", "issues " + HASH + "18",
                       SESSION, "Session " + "9", "sessions " + "21",
                       "work period " + "3", "sprint " + "2",
                       "(" + HASH + "17)", HASH + "18/" + HASH + "20"):
            with self.subTest(marker=marker):
                self.assertEqual(
                    self.found("before, " + marker + ", after\n"), [marker])

    def test_the_line_of_each_marker_is_reported(self):
        text = "\n".join(["# Title", "", "As " + ISSUE + " asked.", "plain",
                          "In " + SESSION + " we measured."])
        self.assertEqual(check_markers.markers(text),
                         [(3, ISSUE), (5, SESSION)])

    def test_a_marker_split_by_a_line_break_is_found_at_its_start(self):
        for first, second in (
                ("// the guarded transport (issue", "// " + HASH + "16)."),
                ("# as the bench of issue", "# " + HASH + "9 runs it"),
                ("measured in session", "22, at noon"),
                ("  * the step of issue", "  * " + HASH + "20")):
            with self.subTest(first=first):
                self.assertEqual(
                    [number for number, _ in
                     check_markers.markers("x\n" + first + "\n" + second)],
                    [2])

    def test_what_is_no_marker_is_left_alone(self):
        self.assertEqual(self.found(
            "// TODO(" + HASH + "12): bound the queue\n"
            "#include \"core/worker.h\"\n"
            "See [layers](architecture.md" + HASH + "1-layers) and "
            "[map](" + HASH + "2-the-agent-seam).\n"
            "An issue of the fabric; a TLS session is resumed; 3 sessions.\n"
            "x = data[" + HASH + "1]  # a session of 3 steps\n"
            "the session\n"
            "ends here\n"), [])


class TreeTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        self.write("WORKSPACE", "")
        self.write("README.md", "# tether\n")
        self.write("docs/guide.md", "A guide.\n")
        self.write("core/worker.cc", "// The worker.\n")

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, path, text):
        full = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)

    def run_main(self):
        out = io.StringIO()
        with redirect_stdout(out):
            code = check_markers.main(["check_markers.py", self.root])
        return code, out.getvalue()

    def test_a_clean_tree_passes(self):
        code, out = self.run_main()
        self.assertEqual(code, 0, out)

    def test_planted_markers_fail_listing_file_and_line(self):
        self.write("docs/guide.md", "A guide.\n\nBuilt in " + SESSION + ".\n")
        self.write("README.md", "# tether\nThe bench (" + ISSUE + ").\n")
        self.write("core/BUILD.bazel", "# Strangers (" + ISSUE + ").\n")
        self.write("tools/bench.py", '"""The bench."""\n# ' + ISSUE + "\n")
        self.write("core/wire/wire.proto", "// " + ISSUE + "\n")
        self.write("scripts/setup.sh", "#!/bin/sh\n# " + ISSUE + "\n")
        self.write("third_party/deps.bzl", "# " + ISSUE + "\n")
        self.write("testing/tsan.supp", "# since " + SESSION + "\n")
        self.write("core/worker.h", "// One\n// two, " + ISSUE + "\n")
        code, out = self.run_main()
        self.assertEqual(code, 1)
        listed = [line.split(": ", 1)[0] for line in out.splitlines()[1:]]
        self.assertEqual(listed, [
            "README.md:2", "core/BUILD.bazel:1", "core/wire/wire.proto:1",
            "core/worker.h:2", "docs/guide.md:3", "scripts/setup.sh:2",
            "testing/tsan.supp:1", "third_party/deps.bzl:1",
            "tools/bench.py:2"])

    def test_files_out_of_scope_are_not_read(self):
        self.write("notes.txt", ISSUE + "\n")
        self.write("docs/bench/table.md", ISSUE + "\n")
        self.write("bazel-out/k8/core/x.cc", "// " + ISSUE + "\n")
        self.write(".git/COMMIT_EDITMSG", ISSUE + "\n")
        self.write("docs/bench/results.json", ISSUE + "\n")
        code, out = self.run_main()
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
