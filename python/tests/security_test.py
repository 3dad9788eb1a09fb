"""A worker never runs what its policy does not allow (docs/security.md).

The callee allows no module beyond its __main__ (which imports os). Each
attempt must be refused, naming the function and how to allow it, and have
no effect: the marker file it would create never appears, and the callee
keeps serving.
"""
import builtins
import os
import subprocess

import pytest
import torch

import tether.rpc as rpc
import workers

CALLEE = os.path.join(workers.HERE, "callee.py")


@pytest.fixture(scope="module")
def callee():
    port = workers.free_port()
    init = "tcp://127.0.0.1:%d" % port
    proc = workers.spawn([CALLEE, init],
                         workers.group_env(1, 2, port, "tensorpipe"))
    rpc.init_rpc("caller", rank=0, world_size=2,
                 rpc_backend_options=rpc.RpcBackendOptions(init_method=init))
    yield "callee"
    rpc.shutdown()
    [(rc, out)] = workers.finish([proc])
    assert rc == 0, out


@pytest.fixture
def marker(tmp_path, callee):
    path = tmp_path / "pwned"
    yield str(path)
    assert not path.exists(), "a refused call had an effect"
    # ... and the callee still serves.
    assert torch.equal(rpc.rpc_sync(callee, torch.add, args=(torch.ones(1), 1)),
                       torch.full((1,), 2.0))


def refused(match):
    return pytest.raises(RuntimeError, match=match)


HOW_TO_ALLOW = r"allowed_modules=\[\.\.\.\] or tether\.rpc\.allow_module"


def test_os_system_is_refused(callee, marker):
    with refused(r"refused to run posix\.system: module 'posix' is not "
                 r"allowed\. .*" + HOW_TO_ALLOW):
        rpc.rpc_sync(callee, os.system, args=("touch " + marker,))


def test_builtins_eval_exec_open_import_are_refused(callee, marker):
    code = "__import__('os').system('touch %s')" % marker
    for fn, args, why in [
            (builtins.eval, (code,), r"builtins\.eval: it is not a harmless"),
            (builtins.exec, (code,), r"builtins\.exec: it is not a harmless"),
            (builtins.__import__, ("os",),
             r"builtins\.__import__: it is not a harmless"),
            (builtins.getattr, ("os", "system"),
             r"builtins\.getattr: it is not a harmless"),
            (builtins.open, (marker, "w"), r"io\.open: module 'io' is not "
                                           r"allowed")]:
        with refused("refused to run " + why):
            rpc.rpc_sync(callee, fn, args=args)


def test_dangerous_functions_as_argument_values_are_refused(callee, marker):
    # A harmless builtin handed a dangerous function as a value: the callee
    # resolves the value as it would a called function, and refuses it.
    with refused(r"refused to run posix\.system: module 'posix' is not "
                 r"allowed\. .*" + HOW_TO_ALLOW):
        rpc.rpc_sync(callee, max, args=(["touch " + marker],),
                     kwargs={"key": os.system})
    with refused(r"refused to run builtins\.eval: it is not a harmless "
                 r"builtin"):
        rpc.rpc_sync(callee, sorted, args=(
            ["__import__('os').system('touch %s')" % marker],),
            kwargs={"key": builtins.eval})
    with refused(r"refused to run subprocess\.Popen: module 'subprocess' "
                 r"is not allowed"):
        rpc.rpc_sync(callee, max, args=([["touch", marker]],),
                     kwargs={"key": subprocess.Popen})


def test_subprocess_popen_is_refused(callee, marker):
    with refused(r"refused to run subprocess\.Popen: module 'subprocess' "
                 r"is not allowed"):
        rpc.rpc_sync(callee, subprocess.Popen, args=(["touch", marker],))
    with refused(r"refused to run subprocess\.Popen"):
        rpc.remote(callee, subprocess.Popen,
                   args=(["touch", marker],)).to_here()


class Malicious:
    """Pickle would run os.system while loading this object."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, ("touch " + self.path,))


class NotAllowedHere:
    """A class of this test module, which the callee does not allow."""

    def __init__(self, value):
        self.value = value


def refused_global(name):
    return refused(r"refused to unpickle a value sent by a peer: the global "
                   + name.replace(".", r"\.") + r" is not allowed on this "
                   r"worker.*add_safe_globals")


def test_object_with_malicious_reduce_is_refused_at_the_callee(callee,
                                                               marker):
    # It travels pickled; the callee's unpickler resolves os.system under
    # its own policy, and refuses it before anything runs.
    evil = Malicious(marker)
    for args, kwargs in [((evil,), None), (([1, evil],), None),
                         (({"k": evil},), None), ((), {"x": evil})]:
        with refused_global("posix.system"):
            rpc.rpc_sync(callee, "py::__main__:main_add", args=args,
                         kwargs=kwargs)
    # As the function: its module is not allowed on the callee.
    with refused(r"refused to run security_test\.Malicious: module "
                 r"'security_test' is not allowed"):
        rpc.rpc_sync(callee, Malicious, args=(marker,))


def test_object_of_a_class_the_callee_does_not_allow_is_refused(callee,
                                                                marker):
    with refused_global("security_test.NotAllowedHere"):
        rpc.rpc_sync(callee, "py::__main__:main_add",
                     args=(NotAllowedHere(1), 2))


class Raw:
    """Sent as these exact pickle bytes (the raw_pickles fixture), as a
    hostile peer could."""

    def __init__(self, data):
        self.data = data


@pytest.fixture
def raw_pickles(monkeypatch):
    from tether.rpc import _pickle
    real = _pickle.dumps

    def dumps(obj):
        return (obj.data, []) if isinstance(obj, Raw) else real(obj)

    monkeypatch.setattr(_pickle, "dumps", dumps)


def send_raw(callee, data):
    return rpc.rpc_sync(callee, len, args=(Raw(data),))


def touch(marker):
    return ("S'touch %s'\n" % marker).encode()


@pytest.mark.parametrize("name,call", [
    ("posix.system", lambda m: b"cposix\nsystem\n(" + touch(m) + b"tR."),
    ("os.system", lambda m: b"cos\nsystem\n(" + touch(m) + b"tR."),
    ("builtins.eval", lambda m: b"cbuiltins\neval\n(S'__import__(\"os\")."
     b"system(\"touch " + m.encode() + b"\")'\ntR."),
    ("builtins.getattr", lambda m: b"cbuiltins\ngetattr\n(c__main__\n"
     b"main_add\nS'__globals__'\ntR."),
    ("subprocess.Popen", lambda m: b"csubprocess\nPopen\n((S'touch'\nS'"
     + m.encode() + b"'\nltR."),
    ("collections.Counter", lambda m: b"ccollections\nCounter\n)R."),
])
def test_crafted_pickles_naming_dangerous_globals_are_refused(
        callee, marker, raw_pickles, name, call):
    with refused_global(name):
        send_raw(callee, call(marker))


@pytest.mark.parametrize("data,error", [
    # numpy's reconstructor asked for a zero-filled 8 GB object array.
    (b"cnumpy.core.multiarray\n_reconstruct\n(cnumpy\nndarray\n"
     b"(I1000000000\ntS'O'\ntR.", r"_reconstruct is not allowed on this "
                                  r"worker with .*only the empty start "
                                  r"numpy itself pickles"),
    # A torch.nn class is rebuilt from its state, never called.
    (b"ctorch.nn.modules.linear\nLinear\n(I100000\nI100000\ntR.",
     r"Linear.* may not be called while unpickling"),
    # Monkey-patching an allowed class: BUILD on an object it did not make.
    (b"c__main__\nHelper\n(dS'__init__'\nc__main__\nmain_add\nsb.",
     r"changes a type it did not make"),
    # Protocol 0's INST runs a class's constructor by name.
    (b"(S'touch x'\nicollections\nOrderedDict\n.", r"INST, OBJ"),
])
def test_allowed_reconstructors_with_hostile_arguments_are_refused(
        callee, marker, raw_pickles, data, error):
    with refused("refused to unpickle a value sent by a peer.*" + error):
        send_raw(callee, data)
    # Helper.__init__ is still the callee's own.
    assert rpc.rpc_sync(callee, "py::__main__:main_add", args=(1, 2)) == 3


@pytest.mark.parametrize("data,error", [
    (b"(" * 100000 + b".", r"containers nested deeper than 64"),
    (b"N" + b"\x85" * 100000 + b".", r"containers nested deeper than 64"),
    (b"]q\x00(" + b"h\x00" * (5 << 20) + b"e.", r"more than 4194304 "
                                                  r"opcodes"),
])
def test_pickle_bombs_are_refused(callee, marker, raw_pickles, data, error):
    with refused("refused to unpickle a value sent by a peer: " + error):
        send_raw(callee, data)


def test_malformed_pickles_are_clear_errors(callee, marker, raw_pickles):
    for data in [b"", b"\x80\x05", b"\xff", b"(l", b"h\x07.",
                 b"\x80\x05Q."]:
        with refused("cannot unpickle a value sent by a peer|a pickled "
                     "value names object"):
            send_raw(callee, data)


@pytest.mark.parametrize("reference,why", [
    # __main__ imported os: reachable by attribute, not defined there.
    ("py::__main__:os.system", "it is not a function or class defined "
                               "there"),
    ("py::__main__:__builtins__.eval", "dunder or local"),
    ("py::__main__:Helper.__init__", "dunder or local"),
    ("py::__main__:main_add.__globals__", "dunder or local"),
    ("py::__main__:torch.load", "it is not a function or class defined "
                                "there"),
    ("py::torch.serialization:load", "module 'torch.serialization' is not "
                                     "allowed"),
    ("py::importlib:import_module", "module 'importlib' is not allowed"),
    ("py::builtins:compile", "not a harmless builtin"),
])
def test_crafted_references_are_refused(callee, marker, reference, why):
    with refused("refused to run .*" + why.replace(".", r"\.")):
        rpc.rpc_sync(callee, reference, args=("touch " + marker,))


def test_operators_that_touch_files_are_refused(callee, marker):
    with refused("operator aten::from_file is refused"):
        rpc.rpc_sync(callee, "aten::from_file", args=("/etc/passwd",))
    with refused("operator aten::from_file is refused"):
        rpc.rpc_sync(callee, torch.from_file, args=("/etc/passwd",))
