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
"""

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
