"""Writes tether's wheel (//python:wheel) with the standard library only.

    build_wheel.py --out tether-V-cp311-cp311-linux_x86_64.whl \
        --version V --python_tag cp311 --platform linux_x86_64 \
        --python_header .../patchlevel.h --description README.md \
        --file tether/rpc/__init__.py=python/tether/rpc/__init__.py ... \
        --file tether/bin/tether_run=bazel-out/.../tools/tether_run

The layout is the wheel format's (PEP 427, PEP 491): the files of the
package at the root, and tether-V.dist-info/ with METADATA (the version,
Requires-Python, the torch release the extension was compiled against, as
tether/_build.py records it), WHEEL (the tags), entry_points.txt (the
tether-run console script), top_level.txt and RECORD (each file's sha256
and size). Entries are sorted and dated 1980-01-01, so the same inputs give
the same bytes. Every input is checked: a tag that is not the Python of the
headers the extension was compiled with, a version that differs from the
package's, a missing file, or one given twice fails the build, naming it.
"""
import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile

EPOCH = (1980, 1, 1, 0, 0, 0)
ENTRY_POINTS = "[console_scripts]\ntether-run = tether.run:main\n"
SUMMARY = ("Distributed RPC for model-parallel training on LibTorch, with "
           "torch.distributed.rpc's API")


def fail(message):
    sys.exit("build_wheel: " + message)


def header_define(path, name):
    with open(path) as f:
        found = re.search(r"^#define\s+%s\s+(\d+)\s*$" % name, f.read(), re.M)
    if not found:
        fail("no #define %s in %s" % (name, path))
    return int(found.group(1))


def build_info(path):
    """The names tether/_build.py defines (VERSION, TORCH_VERSION)."""
    values = {}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), values)
    for name in ("VERSION", "TORCH_VERSION"):
        if not isinstance(values.get(name), str):
            fail("%s defines no %s" % (path, name))
    return values


def metadata(version, python, torch, description):
    major, minor = python
    torch_major, torch_minor, _ = torch.split(".")
    lines = [
        "Metadata-Version: 2.1",
        "Name: tether",
        "Version: " + version,
        "Summary: " + SUMMARY,
        "Requires-Python: >=%d.%d,<%d.%d" % (major, minor, major, minor + 1),
        # The extension links LibTorch of this release; tether/__init__.py
        # checks the running torch against TORCH_VERSION at import.
        "Requires-Dist: torch==%s.%s.*" % (torch_major, torch_minor),
        "Description-Content-Type: text/markdown",
        "",
        description,
    ]
    return "\n".join(lines)


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "%s,sha256=%s,%d" % (name, digest.rstrip(b"=").decode(), len(data))


def add(archive, name, data, executable):
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    archive.writestr(info, data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--python_tag", required=True)
    parser.add_argument("--platform", required=True)
    parser.add_argument("--python_header", required=True,
                        help="patchlevel.h of the headers _C was built with")
    parser.add_argument("--description", required=True,
                        help="a Markdown file: the long description")
    parser.add_argument("--file", action="append", default=[],
                        metavar="NAME=PATH",
                        help="the file PATH at NAME in the wheel")
    args = parser.parse_args()

    python = (header_define(args.python_header, "PY_MAJOR_VERSION"),
              header_define(args.python_header, "PY_MINOR_VERSION"))
    if args.python_tag != "cp%d%d" % python:
        fail("tag %s, but the extension was compiled with Python %d.%d's "
             "headers (%s)" % ((args.python_tag,) + python + (args.python_header,)))
    if not re.fullmatch(r"\d+\.\d+\.\d+", args.version):
        fail("version %r is not MAJOR.MINOR.PATCH" % args.version)
    tag = "%s-%s-%s" % (args.python_tag, args.python_tag, args.platform)
    expected = "tether-%s-%s.whl" % (args.version, tag)
    if os.path.basename(args.out) != expected:
        fail("%s is not named as the wheel of these tags: %s"
             % (args.out, expected))

    files = {}
    for spec in args.file:
        name, sep, path = spec.partition("=")
        if not sep or not name.startswith("tether/"):
            fail("--file %r is not tether/...=PATH" % spec)
        if name in files:
            fail("%s given twice (%s and %s)" % (name, files[name], path))
        if not os.path.isfile(path):
            fail("%s: no file %s" % (name, path))
        files[name] = path
    for needed in ("tether/__init__.py", "tether/_build.py", "tether/_C.so",
                   "tether/libtether_grpc.so", "tether/bin/tether_run",
                   "tether/run.py", "tether/py.typed"):
        if needed not in files:
            fail("the wheel needs %s" % needed)
    info = build_info(files["tether/_build.py"])
    if info["VERSION"] != args.version:
        fail("tether/_build.py says version %s, the wheel %s"
             % (info["VERSION"], args.version))
    with open(args.description) as f:
        description = f.read()

    dist_info = "tether-%s.dist-info" % args.version
    contents = []  # (name, bytes, executable)
    for name in sorted(files):
        with open(files[name], "rb") as f:
            data = f.read()
        contents.append((name, data, os.access(files[name], os.X_OK)
                         and not name.endswith(".py")))
    contents += [
        (dist_info + "/METADATA",
         metadata(args.version, python, info["TORCH_VERSION"],
                  description).encode(), False),
        (dist_info + "/WHEEL",
         ("Wheel-Version: 1.0\nGenerator: tether build_wheel.py\n"
          "Root-Is-Purelib: false\nTag: %s\n" % tag).encode(), False),
        (dist_info + "/entry_points.txt", ENTRY_POINTS.encode(), False),
        (dist_info + "/top_level.txt", b"tether\n", False),
    ]
    record = [record_line(name, data) for name, data, _ in contents]
    record.append(dist_info + "/RECORD,,")
    contents.append((dist_info + "/RECORD",
                     ("\n".join(record) + "\n").encode(), False))

    partial = args.out + ".partial"
    with zipfile.ZipFile(partial, "w") as archive:
        for name, data, executable in contents:
            add(archive, name, data, executable)
    os.replace(partial, args.out)


if __name__ == "__main__":
    main()
