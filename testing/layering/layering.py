"""Checks that tether's layers only point down.

The layers, lowest first: core < backends < rref < autograd < optim <
tether < python. A layer may depend on and include the layers below it,
never one above. testing/, tools/, bench/, examples/ (and third_party/)
are users of the layers, not layers: they are not checked, and a layer's
dependency on them is not checked either.

What is checked, for every target of a layer's BUILD.bazel files that is
not a test (not a *_test rule, not testonly):
  - its deps (labels "//pkg/...:name", select() branches included);
  - the #include "..." lines of its srcs and hdrs;
  - in core's, the code (comments aside) names nothing of a layer above:
    no message type of the RRef or autograd layers (kRRef..., kRemoteCall,
    kAutograd...), no hook of theirs (RRefHook, AutogradHook,
    set_rref_hook, ...), none of the RRef layer's operators or helpers
    (tether::to_here, contains_rref, route_rref_methods) and none of the
    layers' namespaces (rref::, autograd::, optim::). Those layers come in
    through core/worker_extension.h.

The BUILD files are read with Python's ast module (Starlark is Python's
syntax), never with bazel query. Usage:

    python3 layering.py [WORKSPACE_ROOT]

prints each violation as "file:line: what" and exits 1 if there is one.
"""

import ast
import os
import re
import sys

LAYERS = ["core", "backends", "rref", "autograd", "optim", "tether", "python"]
RANK = {name: rank for rank, name in enumerate(LAYERS)}

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
# What core's code must not name (see the module's docstring), and why.
_CORE_MUST_NOT_NAME = [
    (re.compile(r"\bk(?:RRef\w*|RemoteCall|Autograd\w*)\b"),
     "a message type of a layer above"),
    (re.compile(r"\b(?:RRef|Autograd)Hook\b|\b(?:set_)?(?:rref|autograd)_hook\b"),
     "a hook of a layer above"),
    (re.compile(r"\btether::(?:to_here|local_value)\b|\bcontains_rref\b|"
                r"\broute_rref_methods\b"),
     "an operator or helper of the RRef layer"),
    # (LibTorch's torch::autograd:: is not tether's layer.)
    (re.compile(r"(?:(?<![:\w])|(?<=tether::))(?:rref|autograd|optim)::"),
     "a namespace of a layer above"),
]
_LINE_COMMENT = re.compile(r"//.*$")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_FILE_ATTRS = ("srcs", "hdrs", "textual_hdrs")


def layer_of(path):
    """The layer a workspace-relative path or package belongs to, or None."""
    top = path.strip("/").split("/", 1)[0]
    return top if top in RANK else None


def _strings(node):
    """Every string constant inside an expression (lists, select(), +)."""
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            out.append((sub.value, sub.lineno))
    return out


def _is_true(node):
    return isinstance(node, ast.Constant) and node.value is True


def _is_macro(func):
    """Whether a call is one of backends/backend_tests.bzl's macros, called
    as `tether.<macro>(...)`."""
    return (isinstance(func, ast.Attribute) and
            isinstance(func.value, ast.Name) and func.value.id == "tether")


def _macro_kwargs(kind, name, kwargs):
    """The files and deps a macro of backends/backend_tests.bzl derives from
    its name where they are not given (tether.unit's and tether.settings'
    `<folder><name>.cc`, tether.backend_library's `<name>_agent.cc` and its
    :agent_state's sources), as the kwargs of one rule."""
    def files(*paths):
        return ast.List([ast.Constant(p, lineno=0) for p in paths])
    kwargs = dict(kwargs)
    if kind in ("unit", "settings"):
        folder = kwargs.get("folder")
        folder = folder.value if isinstance(folder, ast.Constant) else "internal/"
        kwargs.setdefault("srcs", files(folder + name + ".cc"))
        kwargs.setdefault("hdrs", files(folder + name + ".h"))
    elif kind == "backend_library":
        kwargs["srcs"] = ast.List([files(name + "_agent.cc",
                                         "internal/settings.cc"),
                                   kwargs.get("state_srcs", files())])
        kwargs["hdrs"] = ast.List([files(name + "_agent.h",
                                         "internal/settings.h"),
                                   kwargs.get("state_hdrs",
                                              files("internal/agent_state.h"))])
        kwargs["deps"] = ast.List([kwargs.get("state_deps", files()),
                                   kwargs.get("transport", files())])
    elif kind == "test":
        kwargs["testonly"] = ast.Constant(True, lineno=0)
    return kwargs


def targets(build_path):
    """The rule calls of a BUILD file: (kind, name, line, kwargs nodes)."""
    with open(build_path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=build_path)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        kind = node.func.id if isinstance(node.func, ast.Name) else None
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        if _is_macro(node.func):
            kind = node.func.attr
        if kind is None or "name" not in kwargs:
            continue
        name = kwargs["name"]
        name = name.value if isinstance(name, ast.Constant) else "?"
        if _is_macro(node.func) and isinstance(name, str):
            kwargs = _macro_kwargs(kind, name, kwargs)
        found.append((kind, name, node.lineno, kwargs))
    return found


def _is_test(kind, kwargs):
    return kind.endswith("_test") or _is_true(kwargs.get("testonly"))


def _label_package(label, own_package):
    """The package a dependency label names, or None if external."""
    if label.startswith("@"):
        return None
    if label.startswith("//"):
        return label[2:].split(":", 1)[0]
    if label.startswith(":") or ":" not in label:
        return own_package
    return None


def check(root):
    """Every violation under `root`, as (path, line, message), sorted."""
    violations = []
    for layer in LAYERS:
        top = os.path.join(root, layer)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            if "BUILD.bazel" not in filenames and "BUILD" not in filenames:
                continue
            build_name = "BUILD.bazel" if "BUILD.bazel" in filenames else "BUILD"
            build = os.path.join(dirpath, build_name)
            package = os.path.relpath(dirpath, root).replace(os.sep, "/")
            rel_build = f"{package}/{build_name}"
            for kind, name, line, kwargs in targets(build):
                if _is_test(kind, kwargs):
                    continue
                for dep, dep_line in _strings(kwargs.get("deps", ast.List([]))):
                    dep_package = _label_package(dep, package)
                    dep_layer = layer_of(dep_package) if dep_package else None
                    if dep_layer and RANK[dep_layer] > RANK[layer]:
                        violations.append((rel_build, dep_line, (
                            f"{layer} target :{name} depends on {dep}, "
                            f"of the layer {dep_layer} above it")))
                for attr in _FILE_ATTRS:
                    for src, _ in _strings(kwargs.get(attr, ast.List([]))):
                        if src.startswith(("//", ":", "@")):
                            continue
                        path = os.path.join(dirpath, src)
                        if not os.path.isfile(path):
                            continue
                        violations.extend(_check_includes(
                            path, f"{package}/{src}", layer, name))
                        if layer == "core":
                            violations.extend(_check_core_names(
                                path, f"{package}/{src}", name))
    return sorted(set(violations))


def _check_includes(path, rel, layer, target):
    found = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            match = _INCLUDE.match(text)
            if not match:
                continue
            included = layer_of(match.group(1))
            if included and RANK[included] > RANK[layer]:
                found.append((rel, number, (
                    f"{layer} source (target :{target}) includes "
                    f"\"{match.group(1)}\", of the layer {included} above it")))
    return found


def _check_core_names(path, rel, target):
    """Where core's code (comments aside, strings included) names a layer
    above core."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    # Blank out block comments, keeping their newlines (and so line numbers).
    text = _BLOCK_COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        code = _LINE_COMMENT.sub("", line)
        for pattern, what in _CORE_MUST_NOT_NAME:
            for match in pattern.finditer(code):
                found.append((rel, number, (
                    f"core source (target :{target}) names "
                    f"\"{match.group(0)}\", {what} (layers come in through "
                    "core/worker_extension.h)")))
    return found


def main(argv):
    root = argv[1] if len(argv) > 1 else "."
    violations = check(root)
    for path, line, message in violations:
        print(f"{path}:{line}: {message}")
    if violations:
        print(f"{len(violations)} layering violation(s); the order is "
              + " < ".join(LAYERS))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
