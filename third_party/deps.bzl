"""tether's external repositories, for tether's own WORKSPACE and for users'.

A workspace that uses tether declares it and calls this once:

    local_repository(name = "tether", path = "../tether")  # or http_archive
    load("@tether//third_party:deps.bzl", "tether_dependencies")
    tether_dependencies()

Nothing here downloads: every library is a Debian package (scripts/setup.sh
installs them) and Bazel 4.2's own tools get the offline stand-ins kept in
third_party/ (docs/architecture.md section 10). A repository the workspace already
declared is left as it is, so a user's own rules_cc (say) wins.
"""

load("@bazel_tools//tools/cpp:cc_configure.bzl", "cc_autoconf_impl")

# The environment variables Bazel's cc_autoconf re-runs on
# (@bazel_tools//tools/cpp:cc_configure.bzl), Linux's only.
_CC_AUTOCONF_ENVIRON = [
    "ABI_LIBC_VERSION",
    "ABI_VERSION",
    "BAZEL_COMPILER",
    "BAZEL_HOST_SYSTEM",
    "BAZEL_CXXOPTS",
    "BAZEL_LINKOPTS",
    "BAZEL_LINKLIBS",
    "BAZEL_LLVM_COV",
    "BAZEL_PYTHON",
    "BAZEL_SH",
    "BAZEL_TARGET_CPU",
    "BAZEL_TARGET_LIBC",
    "BAZEL_TARGET_SYSTEM",
    "BAZEL_USE_CPP_ONLY_TOOLCHAIN",
    "BAZEL_DO_NOT_DETECT_CPP_TOOLCHAIN",
    "BAZEL_USE_LLVM_NATIVE_COVERAGE",
    "BAZEL_LLVM",
    "BAZEL_IGNORE_SYSTEM_HEADERS_VERSIONS",
    "CC",
    "CC_CONFIGURE_DEBUG",
    "CC_TOOLCHAIN_NAME",
    "CPLUS_INCLUDE_PATH",
    "GCOV",
    "USER",
]

def _tether_folder_impl(ctx):
    # The folder of tether's source tree that holds the stand-in. A repository
    # rule can resolve a label to a path, which a macro cannot: this is what
    # lets a workspace other than tether's own use the stand-ins.
    here = ctx.path(ctx.attr.anchor).dirname.get_child(ctx.attr.folder)
    if not here.exists:
        fail("tether: no folder %s next to %s" % (ctx.attr.folder, ctx.attr.anchor))
    for child in here.readdir():
        ctx.symlink(child, child.basename)

_tether_folder = repository_rule(
    implementation = _tether_folder_impl,
    attrs = {
        "anchor": attr.label(mandatory = True, allow_single_file = True),
        "folder": attr.string(mandatory = True),
    },
    local = True,
    doc = "A repository made of one folder of tether's third_party/.",
)

def _tether_cc_config_impl(ctx):
    # Bazel's own autoconfigured C++ toolchain (what @local_config_cc would
    # be), with C++17 in place of its default -std=c++0x: LibTorch's and
    # Abseil's headers, and tether's, need C++17, in the user's own files too,
    # and no attribute of a cc_library carries a flag to its dependents.
    # BAZEL_CXXOPTS, when set, is the user's choice and is left alone.
    cc_autoconf_impl(ctx)
    build = ctx.read("BUILD")
    if "BAZEL_CXXOPTS" not in ctx.os.environ:
        if '"-std=c++0x"' not in build:
            fail("tether: Bazel's C++ toolchain no longer says -std=c++0x; " +
                 "update _tether_cc_config in third_party/deps.bzl")
        ctx.file("BUILD", build.replace('"-std=c++0x"', '"-std=c++17"'))

_tether_cc_config = repository_rule(
    implementation = _tether_cc_config_impl,
    environ = _CC_AUTOCONF_ENVIRON,
    configure = True,
    doc = "Bazel's local C++ toolchain, compiling C++17.",
)

def _maybe(rule, name, **kwargs):
    if not native.existing_rule(name):
        rule(name = name, **kwargs)

def tether_dependencies(cxx17_toolchain = True):
    """Declares every repository tether's targets need.

    Args:
      cxx17_toolchain: replaces Bazel's local C++ toolchain with the same one
        compiling C++17 (Bazel 4.2's says -std=c++0x). tether's own workspace
        passes False and keeps its .bazelrc flag, which keeps the actions
        already in the shared disk cache valid.
    """
    if cxx17_toolchain:
        _maybe(_tether_cc_config, name = "local_config_cc")

    # Stand-ins for the repositories Bazel 4.2's own tools ask for.
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        _maybe(
            _tether_folder,
            name = name,
            anchor = Label("//third_party:deps.bzl"),
            folder = name,
        )

    # Debian's libraries. Headers and shared objects live in the standard
    # Debian locations; each BUILD file exposes what a target may include and
    # link. A workspace that already has a repository of one of these names
    # must give it the same targets (docs/decisions.md).
    _maybe(
        native.new_local_repository,
        name = "torch",
        build_file = str(Label("//third_party:torch.BUILD")),
        path = "/usr",
    )

    # CPython's headers (python3-dev), for the Python extension (python/).
    _maybe(
        native.new_local_repository,
        name = "python3",
        build_file = str(Label("//third_party:python.BUILD")),
        path = "/usr",
    )
