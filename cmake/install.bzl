"""The pieces of an installed tether tree (//cmake:install)."""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _tether_headers_impl(ctx):
    headers = [
        f
        for dep in ctx.attr.deps
        for f in dep[CcInfo].compilation_context.headers.to_list()
        # tether's headers (sources and generated), not LibTorch's.
        if f.owner.workspace_name == ctx.label.workspace_name
    ]
    manifest = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.write(manifest, "".join([h.short_path + "\n" for h in headers]))
    return [DefaultInfo(
        files = depset([manifest]),
        runfiles = ctx.runfiles(files = headers + [manifest]),
    )]

tether_headers = rule(
    implementation = _tether_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
    doc = "A manifest of every tether header `deps` include, one path " +
          "inside tether's source tree a line; the headers are its runfiles.",
)

def _tether_shared_library_impl(ctx):
    # cc_binary(linkshared = True) links its dependencies' objects lazily: a
    # shared library that nothing references yet would keep only the
    # alwayslink ones. Here every object of tether's own libraries is linked
    # whole; the system libraries' flags (-ltorch, ...) are kept as given.
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    libraries = []
    flags = []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            flags.extend(linker_input.user_link_flags)
            for library in linker_input.libraries:
                archive = library.pic_static_library or library.static_library
                if not archive:
                    continue
                libraries.append(cc_common.create_library_to_link(
                    actions = ctx.actions,
                    feature_configuration = features,
                    cc_toolchain = cc_toolchain,
                    pic_static_library = archive,
                    alwayslink = True,
                ))
    linking_context = cc_common.create_linking_context(
        linker_inputs = depset([cc_common.create_linker_input(
            owner = ctx.label,
            libraries = depset(libraries),
            user_link_flags = depset(flags),
        )]),
    )
    linked = cc_common.link(
        actions = ctx.actions,
        name = ctx.attr.library_name,
        feature_configuration = features,
        cc_toolchain = cc_toolchain,
        linking_contexts = [linking_context],
        output_type = "dynamic_library",
    )
    library = linked.library_to_link.resolved_symlink_dynamic_library or \
              linked.library_to_link.dynamic_library
    return [DefaultInfo(
        files = depset([library]),
        runfiles = ctx.runfiles(files = [library]),
    )]

tether_shared_library = rule(
    implementation = _tether_shared_library_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "library_name": attr.string(mandatory = True),
        "_cc_toolchain": attr.label(
            default = Label("@bazel_tools//tools/cpp:current_cc_toolchain"),
        ),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
    doc = "lib<library_name>.so: every object of `deps` linked whole.",
)
