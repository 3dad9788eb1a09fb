"""C++ code generated from .proto files by the system protoc (no download)."""

def tether_cc_proto_library(name, srcs, deps = [], visibility = None):
    """A cc_library of the messages in `srcs` (proto3, one package).

    The generated code includes the protos by their workspace-relative path,
    the same path other .proto files import them by.
    """
    pkg = native.package_name()
    bases = [s[:-len(".proto")] for s in srcs]
    outs_h = [b + ".pb.h" for b in bases]
    outs_cc = [b + ".pb.cc" for b in bases]
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs_h + outs_cc,
        cmd = "protoc --proto_path=. --cpp_out=$(GENDIR) " +
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
