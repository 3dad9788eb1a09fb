"""C++ code generated from .proto files by the system protoc (no download)."""

def tether_cc_proto_library(name, srcs, deps = [], visibility = None):
    """A cc_library of the messages in `srcs` (proto3, one package).

    The generated code includes the protos by their path inside tether's
    source tree, the same path other .proto files import them by, and the
    same path tether's sources include the headers by, whether tether is the
    main workspace or another workspace's external repository (where Bazel
    puts its files under external/NAME).
    """
    pkg = native.package_name()
    repo = native.repository_name()  # "@" in tether's own workspace
    root = "." if repo == "@" else "external/" + repo[1:]
    out_dir = "$(GENDIR)" if root == "." else "$(GENDIR)/" + root
    bases = [s[:-len(".proto")] for s in srcs]
    outs_h = [b + ".pb.h" for b in bases]
    outs_cc = [b + ".pb.cc" for b in bases]
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs_h + outs_cc,
        cmd = "protoc --proto_path=%s --cpp_out=%s " % (root, out_dir) +
              " ".join(["$(location %s)" % s for s in srcs]),
        message = "protoc " + pkg,
    )
    native.cc_library(
        name = name,
        srcs = outs_cc,
        hdrs = outs_h,
        deps = deps + ["//third_party:protobuf"],
        visibility = visibility,
    )
