"""The standard test targets of a backend, declared in one call.

A backend opts into the areas of the conformance suite (testing/*.h) each
with a one-line test source beside its BUILD file; `tether_backend_tests`
declares the targets that build them, with the sizes and shards they need,
and a test_suite `<name>_conformance_tests` of all of them:

    load("//backends:backend_tests.bzl", "tether_backend_tests")

    tether_backend_tests(
        name = "foo",
        backend = ":foo",
    )

declares, for the sources of the same names:
  foo_agent_test               the agent area (testing/agent_conformance.h)
  foo_agent_multiprocess_test  the same across processes
  foo_creation_test            creation and settings
                               (testing/creation_conformance.h)
  foo_auth_test                authentication (testing/auth_conformance.h)
  foo_hostile_test             hostile peers (testing/hostile_peers.h)

`tether_fuzz_test` declares a decoder's libFuzzer target and its smoke test
in the default suite (docs/fuzzing.md).

The rest of a backend's BUILD file is small libraries with a unit test
beside them, and tests of what is specific to the backend; so that a BUILD
file states only what differs:

  tether_unit(name = "x", deps = [...])
      the library x of internal/x.cc and internal/x.h, over Abseil, and, with
      `test = True`, its test foo_x_test of internal/x_test.cc;
  tether_backend_library(name = "foo", transport = ..., state_srcs = ...)
      a backend over //backends/common:agent_skeleton: its public library
      foo of foo_agent.cc and foo_agent.h, its :agent_state (the hooks for
      the skeleton) and its :settings (internal/settings.*);
  tether_test(name = "foo_test", deps = [...])
      a test of foo_test.cc over the status matchers, Abseil and gtest;
  tether_backend_test(name = "foo_backend_test", deps = [...])
      a test of foo_backend_test.cc with what such tests use (the agent
      testing helpers, the status matchers, gtest).
"""

# What a backend's agent state over //backends/common:agent_skeleton
# needs: the skeleton and its parts, the handshake, the store join.
SKELETON_STATE_DEPS = [
    "//backends/common:agent_skeleton",
    "//backends/common:agent_support",
    "//backends/common:peer_table",
    "//backends/common:refusals",
    "//core:agent",
    "//core/toolkit:pending_requests",
    "//core/toolkit:serial_executor",
    "//core/toolkit:timer",
    "//core/auth",
    "//core/auth:handshake",
    "//core/join:store_join",
    "//third_party:absl",
    "//third_party:glog",
    "//third_party:torch",
]

# What a unit test of one library uses beside it.
_UNIT_TEST_DEPS = [
    "//testing:status_matchers",
    "//third_party:absl",
    "//third_party:gtest_main",
]

def _test_name(area):
    """`<backend>_<area>_test` in a backend's package (backends/<backend>),
    `<area>_test` in backends/common."""
    package = native.package_name()
    if package.startswith("backends/") and package != "backends/common":
        return "%s_%s_test" % (package.split("/")[-1], area)
    return area + "_test"

def tether_unit(
        name,
        deps = [],
        folder = "internal/",
        srcs = None,
        hdrs = None,
        test = False,
        test_size = "small",
        test_deps = [],
        **kwargs):
    """A library `name` of `<folder><name>.cc` and `<folder><name>.h`, and
    with `test`, its unit test of `<folder><name>_test.cc`, named
    `<backend>_<name>_test` in a backend's package (`<name>_test` in
    backends/common).

    Args:
      name: the library, and the stem of its files.
      deps: what the library needs beyond Abseil, which every one uses
        (absl::Status at least).
      folder: where its files are, from the package ("internal/").
      srcs: its sources, if not `<folder><name>.cc` ([] for a header).
      hdrs: its headers, if not `<folder><name>.h`.
      test: whether it has a unit test beside it.
      test_size: the test's size.
      test_deps: what the test needs beyond the library, the status
        matchers, Abseil and gtest_main.
      **kwargs: the library's other attributes (visibility, linkstatic).
    """
    native.cc_library(
        name = name,
        srcs = [folder + name + ".cc"] if srcs == None else srcs,
        hdrs = [folder + name + ".h"] if hdrs == None else hdrs,
        deps = deps + ["//third_party:absl"],
        **kwargs
    )
    if test:
        native.cc_test(
            name = _test_name(name),
            size = test_size,
            srcs = [folder + name + "_test.cc"],
            deps = [":" + name] + _UNIT_TEST_DEPS + test_deps,
        )

def tether_backend_library(
        name,
        transport,
        state_srcs,
        state_deps,
        state_hdrs = ["internal/agent_state.h"]):
    """A backend over //backends/common:agent_skeleton, as three libraries:
    `name`, the public one, of `<name>_agent.cc` and `<name>_agent.h`;
    :agent_state, the backend's hooks for the skeleton (client side, server
    side, creation and shutdown), over SKELETON_STATE_DEPS; :settings, the
    "<name>.*" keys, read with //backends/common:settings_toolkit from
    internal/settings.*. Each is over `transport`'s library where it needs
    it.

    Args:
      name: the backend's name and public library.
      transport: the library the backend moves bytes with.
      state_srcs: the sources of :agent_state.
      state_deps: what :agent_state needs beyond SKELETON_STATE_DEPS,
        :settings and the transport (its framing).
      state_hdrs: the headers of :agent_state.
    """
    native.cc_library(
        name = name,
        srcs = [name + "_agent.cc"],
        hdrs = [name + "_agent.h"],
        visibility = ["//visibility:public"],
        deps = [
            ":agent_state",
            ":settings",
            "//backends/common:agent_skeleton",
            "//core:agent",
            "//third_party:absl",
            transport,
        ],
    )
    native.cc_library(
        name = "agent_state",
        srcs = state_srcs,
        hdrs = state_hdrs,
        deps = SKELETON_STATE_DEPS + state_deps + [":settings", transport],
    )
    tether_settings(name = "settings")

def tether_settings(name):
    """A backend's settings library `name` (:settings): its "<backend>.*"
    keys, read from internal/<name>.{cc,h} with
    //backends/common:settings_toolkit.

    Args:
      name: the library, and the stem of its files.
    """
    tether_unit(
        name = name,
        deps = ["//backends/common:settings_toolkit"],
    )

def tether_test(name, deps, size = "small"):
    """A test of `<name>.cc`, over `deps`, the status matchers, Abseil and
    gtest_main.

    Args:
      name: the test, and the stem of its source.
      deps: what the source needs beyond the matchers and gtest.
      size: the test's size.
    """
    native.cc_test(
        name = name,
        size = size,
        srcs = [name + ".cc"],
        deps = deps + _UNIT_TEST_DEPS,
    )

def tether_backend_test(name, deps, size = "small"):
    """A test of what is specific to a backend, of `<name>.cc`, with what
    such tests use: core:agent, the agent testing helpers
    (testing/agent_testing.h), the status matchers, Abseil, LibTorch, gtest.

    Args:
      name: the test, and the stem of its source.
      deps: the backend's library and what else the source needs.
      size: the test's size.
    """
    tether_test(
        name = name,
        size = size,
        deps = deps + [
            "//core:agent",
            "//testing:agent_testing",
            "//third_party:torch",
        ],
    )

def _variant_name(name, variant, area):
    if variant:
        return "%s_%s_%s_test" % (name, variant, area)
    return "%s_%s_test" % (name, area)

def _area_test(name, area, deps, size = "small", shard_count = None):
    """A cc_test of one area of the conformance suite, from `<name>.cc`."""
    native.cc_test(
        name = name,
        size = size,
        shard_count = shard_count,
        srcs = [name + ".cc"],
        deps = deps + [
            "//testing:" + area,
            "//third_party:gtest_main",
        ],
    )

def tether_backend_tests(
        name,
        backend,
        variants = [""],
        hostile_variants = None,
        agent_size = "small",
        multiprocess_shard_count = None,
        hostile_shard_count = 2,
        auth_deps = [],
        hostile_deps = []):
    """Declares a backend's standard conformance test targets.

    Args:
      name: the backend's name, the prefix of every target.
      backend: its library target.
      variants: settings variants (e.g. a provider) with agent and
        multi-process targets of their own, `<name>_<variant>_agent_test`;
        [""] (the default): one, `<name>_agent_test`.
      hostile_variants: the variants with a hostile-peer target (default:
        all of `variants`).
      agent_size: the size of the in-process agent tests.
      multiprocess_shard_count: shards of the multi-process agent tests
        (each test starts 2 or 3 processes).
      hostile_shard_count: shards of the hostile-peer tests (each test
        starts 3 processes).
      auth_deps: what the auth test's source needs beyond the suite.
      hostile_deps: what the hostile-peer test's source needs beyond the
        suite (the backend's HostileDialect).
    """
    if hostile_variants == None:
        hostile_variants = variants
    tests = []

    for variant in variants:
        agent = _variant_name(name, variant, "agent")
        _area_test(agent, "agent_conformance", [backend], size = agent_size)
        multiprocess = _variant_name(name, variant, "agent_multiprocess")
        _area_test(
            multiprocess,
            "agent_conformance_multiprocess",
            [backend],
            size = "medium",
            shard_count = multiprocess_shard_count,
        )
        tests += [agent, multiprocess]

    for variant in hostile_variants:
        hostile = _variant_name(name, variant, "hostile")
        _area_test(
            hostile,
            "hostile_peers",
            [backend] + hostile_deps,
            size = "medium",
            shard_count = hostile_shard_count,
        )
        tests.append(hostile)

    _area_test(name + "_creation_test", "creation_conformance", [backend])

    # Workers made by name through the registry (//backends:builtin).
    _area_test(name + "_auth_test", "auth_conformance", auth_deps)
    tests += [name + "_creation_test", name + "_auth_test"]

    native.test_suite(
        name = name + "_conformance_tests",
        tests = tests,
    )

def tether_fuzz_test(name, src, corpus, deps, corpus_maker = None):
    """A libFuzzer target `name` (manual: the long run needs clang) and
    `<name>_smoke_test` in the default suite: the corpus and 20000 seeded
    mutations through the gcc-built stand-in driver (//testing/fuzz); with
    `corpus_maker`, the manual binary that writes the corpus's seeds, named
    after its source (`internal/make_x_corpus.cc` gives `make_x_corpus`).

    Args:
      name: the fuzz target.
      src: its source, defining LLVMFuzzerTestOneInput.
      corpus: the folder of its corpus, in this package.
      deps: what the source needs (and so does the corpus maker).
      corpus_maker: the source of the corpus generator, over
        //backends/common:fuzz_corpus.
    """
    if corpus_maker:
        native.cc_binary(
            name = corpus_maker.split("/")[-1][:-len(".cc")],
            srcs = [corpus_maker],
            tags = ["manual"],
            deps = deps + [
                "//backends/common:fuzz_corpus",
                "//third_party:torch",
            ],
        )
    # The source states its properties with TETHER_CHECK.
    deps = deps + ["//core/toolkit:check"]
    native.cc_binary(
        name = name,
        srcs = [src],
        tags = ["manual"],
        deps = deps,
    )
    native.cc_test(
        name = name + "_smoke_test",
        size = "small",
        srcs = [src],
        args = [
            "%s/%s" % (native.package_name(), corpus),
            "--runs=20000",
        ],
        data = native.glob([corpus + "/*"]),
        deps = deps + ["//testing/fuzz:fuzz_driver"],
    )

# The macros under one name, so that a BUILD file loads them in one line:
#   load("//backends:backend_tests.bzl", "tether")
#   tether.unit(name = "framing", test = True, deps = [...])
tether = struct(
    backend_library = tether_backend_library,
    backend_test = tether_backend_test,
    backend_tests = tether_backend_tests,
    fuzz_test = tether_fuzz_test,
    settings = tether_settings,
    test = tether_test,
    unit = tether_unit,
)
