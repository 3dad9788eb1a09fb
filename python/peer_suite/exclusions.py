"""Which of the peer's tests peer_suite does not run, and why.

A test is excluded when its code (the test method, and the helper functions
and classes of the peer's test files it names, followed a few levels)
names one of the peer's own non-public APIs listed in GROUPS, or when it is
listed by name in BY_NAME (what a reading of the test shows and no name
gives away: pickled arbitrary objects, the peer's own agent behaviour).
Each group carries the reason the report prints. Everything else runs.
"""
import ast
import inspect
import re
import textwrap

# (group, reason, names): a test is in the group if its code names any of
# these (as a word).
GROUPS = [
    ("peer pickler",
     "the peer's own pickler object and its internal message classes "
     "(tether pickles with its own restricted pickler: docs/security.md)",
     ["_use_rpc_pickler", "_internal_rpc_pickler", "_default_pickler",
      "PythonUDF"]),
    ("peer agent objects",
     "the peer's agent object, its backend plug-in registry and mocks of "
     "its internals",
     ["TensorPipeAgent", "register_backend",
      "_init_rpc_backend", "_is_current_rpc_agent_set", "mock",
      "StubRpcAgent", "FooBackendOptions"]),
    ("peer internal collectives",
     "the peer's internal helpers of its shutdown (tether has _all_gather, "
     "_barrier, _wait_all_workers and _wait_all)",
     ["_broadcast_to_followers",
      "_delete_all_user_and_unforked_owner_rrefs"]),
    ("fails on the peer too",
     "fails the same way on the peer itself with Debian's torch 1.13 on "
     "Python 3.11 (torch's own modules, not RPC)",
     []),
    ("CUDA",
     "needs GPUs and CUDA device maps: this machine has no GPU and tether "
     "for Python moves CPU tensors",
     ["skip_if_lt_x_gpu", "device_maps", "set_device_map"]),
]

# Tests excluded by name, with their group (a reading of the test shows
# why).
BY_NAME = {
    # Asserts the peer pickler's own error text ("RPC pickler does not
    # serialize"); tether names the missing function instead.
    "test_function_not_on_callee": "peer pickler",
    # DistributedDataParallel's import raises "mutable default ... for field
    # tensor_properties" under Python 3.11, on the peer as here.
    "test_pg_init_no_rpc_init": "fails on the peer too",
}

REASONS = {group: reason for group, reason, _ in GROUPS}

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HELPER_DEPTH = 3
# Helpers are followed into the peer's RPC test files only (not into the
# generic test-case classes every test names, e.g. assertEqual).
_PEER_PREFIX = ("torch.testing._internal.distributed.rpc",
                "torch.testing._internal.dist_utils")


_sources = {}  # id -> (object, source); inspect.getsource is slow


def _code_only(source):
    """`source` without its comments and docstrings, whose words name no
    use (dist_utils' helper mentions _get_debug_info in its docstring)."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def _source(obj):
    obj = inspect.unwrap(obj)
    cached = _sources.get(id(obj))
    if cached is not None and cached[0] is obj:
        return cached[1]
    try:
        source = _code_only(inspect.getsource(obj))
    except (OSError, TypeError):
        source = ""
    _sources[id(obj)] = (obj, source)
    return source


def _is_suite(cls):
    """A class of the peer's tests (RpcTest, DistAutogradTest, ...)."""
    return any(name.startswith("test_") for name in vars(cls))


def _names_reached(test_class, test_name):
    """Every word in the test's code and in the code of the peer's helpers
    it names, followed _HELPER_DEPTH levels. A suite class the code names
    (`RpcTest._multi_args_fn`) is not read whole, which would reach every
    test's words: the names the code takes from it are followed instead."""
    method = getattr(test_class, test_name)
    module = inspect.getmodule(inspect.unwrap(method))
    namespace = vars(module) if module else {}
    suites = [test_class]
    words = set()
    todo = [(_source(method), 0)]
    seen = set()
    while todo:
        source, depth = todo.pop()
        found = set(_WORD.findall(source))
        words |= found
        if depth >= _HELPER_DEPTH:
            continue
        for word in sorted(found):
            target = namespace.get(word)
            if inspect.isclass(target) and _is_suite(target) and (
                    target not in suites):
                suites.append(target)
        for word in found - seen:
            seen.add(word)
            target = namespace.get(word)
            if target is None:
                target = next((getattr(c, word) for c in suites
                               if hasattr(c, word)), None)
            if inspect.isclass(target) and _is_suite(target):
                continue
            if (target is not None
                    and (inspect.isfunction(inspect.unwrap(target))
                         or inspect.isclass(target))
                    and getattr(target, "__module__", "").startswith(
                        _PEER_PREFIX)):
                todo.append((_source(target), depth + 1))
    return words


def reason_for(test_class, test_name):
    """(group, names that put it there) or None when the test runs."""
    key = "%s.%s" % (test_class.__name__, test_name)
    if key in BY_NAME or test_name in BY_NAME:
        return BY_NAME.get(key) or BY_NAME[test_name], ["listed by name"]
    words = _names_reached(test_class, test_name)
    words |= set(test_name.split("_"))
    for group, _, names in GROUPS:
        hits = sorted(n for n in names if n in words)
        if hits:
            return group, hits
    return None
