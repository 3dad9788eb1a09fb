"""The ABI id of a backend plugin: what the program that loads a plugin and
the plugin itself must agree on (backends/common/plugin_library.h).

    tether_plugin_abi(name = "plugin_abi", out = "plugin_abi.h", deps = [...])

writes a header that defines TETHER_PLUGIN_ABI_ID, a hash of every header
of this workspace that `deps` include (their transitive headers, by path and
content), of `srcs`, of the compilation mode and of the C and C++ options
given on the command line (--copt, --cxxopt: a sanitizer config's
-fsanitize=..., a -D that changes a layout). Objects that cross between a
program and its plugin (an Agent, Messages, futures, callbacks, AgentSetup)
are laid out by those headers compiled that way, so two builds whose ids are
equal agree on them, and a plugin of a build with other options (say, not
instrumented, for a program under --config=asan) is refused; the system
libraries' headers (LibTorch, Abseil) are left out: both sides load the
same installed libraries at run time.
"""

def _short_path(file):
    return file.short_path

def _plugin_abi_impl(ctx):
    headers = depset(transitive = [
        dep[CcInfo].compilation_context.headers
        for dep in ctx.attr.deps
    ])
    own = sorted(
        [
            header
            for header in headers.to_list()
            if header.owner.workspace_name == ctx.label.workspace_name
        ] + ctx.files.srcs,
        key = _short_path,
    )
    out = ctx.actions.declare_file(ctx.attr.out)
    args = ctx.actions.args()
    args.add(out)
    args.add(" ".join(
        [ctx.var["COMPILATION_MODE"]] + ctx.fragments.cpp.copts +
        ctx.fragments.cpp.cxxopts,
    ))
    for header in own:
        args.add(header.short_path)
        args.add(header)
    ctx.actions.run_shell(
        inputs = own,
        outputs = [out],
        arguments = [args],
        progress_message = "Hashing the plugin ABI's headers for %s" % ctx.label,
        command = """
out="$1"; compiled="$2"; shift 2
id="$( {
  echo "$compiled"
  while [ $# -gt 0 ]; do echo "$1"; cat "$2"; shift 2; done
} | sha256sum | cut -c1-16 )"
cat >"$out" <<EOT
// Written by Bazel (backends/common/plugin_abi.bzl): a hash of the headers
// that lay out what crosses between a program and a backend plugin.
#define TETHER_PLUGIN_ABI_ID "$id"
EOT
""",
    )
    return [DefaultInfo(files = depset([out]))]

tether_plugin_abi = rule(
    implementation = _plugin_abi_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "srcs": attr.label_list(allow_files = True),
        "out": attr.string(mandatory = True),
    },
    fragments = ["cpp"],
)
