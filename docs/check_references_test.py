"""Tests of check_references.py on small trees made for each test: broken
references of every kind are found, sound ones and what is not the
repository's are left alone."""
import os
import tempfile
import unittest

from docs import check_references


class CheckReferencesTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        for path, text in {
                "WORKSPACE": "",
                "BUILD.bazel": "",
                "README.md": "",
                "core/BUILD.bazel": 'cc_library(name = "worker")\n'
                                    '[cc_test(name = "%s_test" % b)]\n'
                                    'genrule(name = "v", outs = ["v.h"])\n',
                "core/worker.h": "",
                "python/BUILD.bazel": '[sh_test(name = test) for test in T]\n',
                "tools/bench_worker.cc": "",
                "docs/bench/plot.png": "",
        }.items():
            full = os.path.join(self.root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)

    def tearDown(self):
        self.tmp.cleanup()

    def broken(self, text):
        with open(os.path.join(self.root, "docs", "doc.md"), "w") as f:
            f.write(text)
        return [ref for _, ref in
                check_references.broken_references(self.root, "docs/doc.md")]

    def test_sound_references_pass(self):
        self.assertEqual(self.broken(
            "`core/worker.h` and `core/worker.h:12`, `core/` `core/*.h`\n"
            "`bazel-bin/tools/bench_worker --quick`, `//core:worker`,\n"
            "`//core:grpc_test` `//core/...` `//...` ![plot](bench/plot.png)\n"
            "`//python:rpc_test` `//core:v.h`\n"
            "[map](../README.md#use) [web](https://example.org/a/b)\n"
            "```sh\ncore/worker.h --out=docs/bench\n```\n"), [])

    def test_missing_paths_are_found(self):
        self.assertEqual(self.broken(
            "See `core/rref_context.h` and `core/worker.cc:3`.\n"
            "```\ntools/nothing --flag\n```\n"),
            ["core/rref_context.h", "core/worker.cc:3", "tools/nothing"])

    def test_missing_labels_are_found(self):
        self.assertEqual(self.broken(
            "`//core:agent` `//rref:rref_test` `//core/wire/...`\n"
            "`//core:w.h`\n"),
            ["//core:agent", "//rref:rref_test", "//core/wire/...",
             "//core:w.h"])

    def test_targets_of_backend_tests_bzl_macros_are_known(self):
        os.makedirs(os.path.join(self.root, "backends", "foo"))
        with open(os.path.join(self.root, "backends", "foo", "BUILD.bazel"),
                  "w") as f:
            f.write('tether.backend_library(\n    name = "foo",\n)\n'
                    'tether.unit(\n    name = "framing",\n'
                    '    test = True,\n)\n'
                    'tether.unit(\n    name = "bytes",\n)\n'
                    'tether.fuzz_test(\n    name = "framing_fuzz",\n)\n')
        self.assertEqual(self.broken(
            "`//backends/foo:framing_test` `//backends/foo:agent_state`\n"
            "`//backends/foo:settings` `//backends/foo:framing_fuzz_smoke_test`\n"
            "`//backends/foo:bytes_test` `//backends/foo:foo_test`\n"),
            ["//backends/foo:bytes_test", "//backends/foo:foo_test"])

    def test_missing_link_targets_are_found(self):
        self.assertEqual(self.broken(
            "[arch](architecture.md) ![p](bench/none.png) [ok](#anchor)\n"),
            ["architecture.md", "bench/none.png"])

    def test_what_is_not_the_repositorys_is_left_alone(self):
        self.assertEqual(self.broken(
            "`/usr/include/torch/x.h` `torch/testing/_internal/rpc` "
            "`absl/status/status.h` `tether/join/<scope>/` "
            "`python/tests/%s.py` `$PWD/core/none` `http://core/none`\n"), [])


if __name__ == "__main__":
    unittest.main()
