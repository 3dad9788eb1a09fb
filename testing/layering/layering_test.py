"""Tests of layering.py, and the check of this tree's layers itself."""

import os
import sys
import tempfile
import textwrap
import unittest

# The real files behind the runfiles: the tree this test checks.
HERE = os.path.dirname(os.path.realpath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import layering  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(text))


class ThisTree(unittest.TestCase):
    def test_every_layer_points_down(self):
        self.assertTrue(os.path.isfile(os.path.join(ROOT, "core", "BUILD.bazel")),
                        f"not a tether tree: {ROOT}")
        violations = layering.check(ROOT)
        self.assertEqual(
            violations, [],
            "\n".join(f"{p}:{l}: {m}" for p, l, m in violations))


class Checker(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.root = self._dir.name
        # A tree that obeys the order: rref uses core, autograd uses rref.
        write(self.root, "core/BUILD.bazel", """
            cc_library(name = "worker", srcs = ["worker.cc"], hdrs = ["worker.h"])
            """)
        write(self.root, "core/worker.h", "#pragma once\n")
        write(self.root, "core/worker.cc", '#include "core/worker.h"\n')
        write(self.root, "rref/BUILD.bazel", """
            cc_library(
                name = "rref",
                srcs = ["rref.cc"],
                deps = ["//core:worker", "//third_party:absl"],
            )
            """)
        write(self.root, "rref/rref.cc", '#include "core/worker.h"\n')
        write(self.root, "autograd/BUILD.bazel", """
            cc_library(name = "rref_backward", srcs = ["b.cc"], deps = ["//rref"])
            """)
        write(self.root, "autograd/b.cc", '#include "rref/rref.h"\n')

    def tearDown(self):
        self._dir.cleanup()

    def test_a_tree_that_points_down_passes(self):
        self.assertEqual(layering.check(self.root), [])

    def test_a_dependency_on_a_layer_above_is_caught(self):
        write(self.root, "rref/BUILD.bazel", """
            cc_library(
                name = "rref",
                srcs = ["rref.cc"],
                deps = ["//core:worker"] + select({
                    "//conditions:default": ["//autograd:rref_backward"],
                }),
            )
            """)
        violations = layering.check(self.root)
        self.assertEqual(len(violations), 1, violations)
        path, line, message = violations[0]
        self.assertEqual(path, "rref/BUILD.bazel")
        self.assertEqual(line, 6)
        self.assertIn("//autograd:rref_backward", message)
        self.assertIn("layer autograd above it", message)

    def test_an_include_of_a_layer_above_is_caught(self):
        write(self.root, "core/worker.cc",
              '#include "core/worker.h"\n#include "backends/builtin.h"\n')
        self.assertEqual(layering.check(self.root), [(
            "core/worker.cc", 2,
            'core source (target :worker) includes "backends/builtin.h", '
            "of the layer backends above it")])

    def test_core_naming_a_layer_is_caught(self):
        write(self.root, "core/worker.h", """
            #pragma once
            enum class MessageType { kCall = 1, kRRefFetch = 7 };
            void set_autograd_hook(AutogradHook* hook);
            """)
        write(self.root, "core/worker.cc", """
            #include "core/worker.h"
            const char* kOp = "tether::to_here";
            bool f(const Value& v) { return rref::contains_rref(v); }
            """)
        self.assertEqual(
            [(p, l, m.split(" names ")[1].split(",")[0])
             for p, l, m in layering.check(self.root)],
            [("core/worker.cc", 3, '"tether::to_here"'),
             ("core/worker.cc", 4, '"contains_rref"'),
             ("core/worker.cc", 4, '"rref::"'),
             ("core/worker.h", 3, '"kRRefFetch"'),
             ("core/worker.h", 4, '"AutogradHook"'),
             ("core/worker.h", 4, '"set_autograd_hook"')])

    def test_core_comments_and_tests_may_name_layers(self):
        write(self.root, "core/BUILD.bazel", """
            cc_library(name = "worker", srcs = ["worker.cc"], hdrs = ["worker.h"])
            cc_test(name = "worker_test", srcs = ["worker_test.cc"])
            """)
        write(self.root, "core/worker.h", """
            #pragma once
            // The RRef layer's kRRefFetch comes in through an extension.
            /* as does set_autograd_hook,
               and rref::contains_rref */
            int RRefType = 1;  // c10's RRef kind is not a layer's name
            """)
        write(self.root, "core/worker_test.cc", "int x = MessageType::kRRefFetch;\n")
        self.assertEqual(layering.check(self.root), [])

    def test_subpackages_belong_to_their_layer(self):
        write(self.root, "backends/grpc/BUILD.bazel", """
            cc_library(name = "grpc", hdrs = ["agent.h"], deps = ["//tether"])
            """)
        write(self.root, "backends/grpc/agent.h", '#include "optim/optimizer.h"\n')
        violations = layering.check(self.root)
        self.assertEqual([(p, l) for p, l, _ in violations],
                         [("backends/grpc/BUILD.bazel", 2),
                          ("backends/grpc/agent.h", 1)])

    def test_targets_of_backend_tests_bzl_macros_are_checked(self):
        # tether.unit(name = "x") is internal/x.cc and internal/x.h.
        write(self.root, "backends/grpc/BUILD.bazel", """
            tether.unit(
                name = "framing",
                deps = ["//rref"],
            )
            """)
        write(self.root, "backends/grpc/internal/framing.h",
              '#include "optim/optimizer.h"\n')
        violations = layering.check(self.root)
        self.assertEqual([(p, l) for p, l, _ in violations],
                         [("backends/grpc/BUILD.bazel", 4),
                          ("backends/grpc/internal/framing.h", 1)])

    def test_tests_and_users_are_exempt(self):
        # A layer's tests may run it over anything (core's over loopback).
        write(self.root, "core/BUILD.bazel", """
            cc_library(name = "worker", srcs = ["worker.cc"], hdrs = ["worker.h"])
            cc_test(name = "worker_test", srcs = ["worker_test.cc"],
                    deps = ["//backends:builtin"])
            cc_library(name = "fixture", testonly = True, srcs = ["f.cc"],
                       deps = ["//rref"])
            """)
        write(self.root, "core/worker_test.cc", '#include "backends/builtin.h"\n')
        write(self.root, "core/f.cc", '#include "rref/rref.h"\n')
        # Users of the layers are not layers.
        write(self.root, "testing/BUILD.bazel", """
            cc_library(name = "group", srcs = ["g.cc"], deps = ["//python"])
            """)
        write(self.root, "testing/g.cc", '#include "python/src/module.h"\n')
        self.assertEqual(layering.check(self.root), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
