#!/usr/bin/python3
"""The wheel as a user installs it (//python:wheel_test).

    wheel_test.py WHEEL VERSION_BZL

Makes a virtual environment with Debian's python3 (--system-site-packages,
for python3-torch) in a temporary folder, installs WHEEL with pip offline
(--no-index) and, from that folder with PYTHONPATH unset, so that nothing
comes from the source tree: checks that tether is the installed one, that
its versions agree (pip show, importlib.metadata, tether.__version__, the
C++ library's and tether/version.bzl's), that its files load with what the
system has (ldd), that the import refuses another torch, runs the three seed
programs of examples/python/ under the installed tether-run and one example,
type-checks the seeds with mypy against the installed stubs, and runs
`python -m tether.run`; then uninstalls it and checks that it is gone.
Prints how long the venv, the install and each step took.
"""
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

# The source tree: Bazel's runfiles (where sh_test puts this file as
# python/wheel_test), or the checkout this file is in.
if "TEST_SRCDIR" in os.environ:
    REPO = os.path.join(os.environ["TEST_SRCDIR"],
                        os.environ.get("TEST_WORKSPACE", "tether"))
else:
    REPO = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples", "python")
sys.path.insert(0, os.path.join(REPO, "python", "tests"))
from examples_test import check_pipeline  # noqa: E402
from seeds_test import check_remote_rref, check_split_model  # noqa: E402
from workers import free_port  # noqa: E402

SYSTEM_PYTHON = "/usr/bin/python3"
TIMEOUT = 150


def check_rpc_async(out):
    assert "torch.add + min: tensor([5., 5.])" in out, out
    assert "my_add: tensor([2., 2.])" in out, out


# file, world size, check of rank 0's output
SEEDS = [
    ("rpc_async_seed.py", 2, check_rpc_async),
    ("remote_rref_seed.py", 2, check_remote_rref),
    ("split_model_seed.py", 3, check_split_model),
]


class Venv:
    def __init__(self, root):
        self.root = root
        self.python = os.path.join(root, "bin", "python")
        self.work = os.path.join(os.path.dirname(root), "work")
        os.makedirs(self.work)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
        self.env.update(PATH=os.path.join(root, "bin") + ":/usr/bin:/bin",
                        VIRTUAL_ENV=root, PIP_NO_INDEX="1",
                        PIP_DISABLE_PIP_VERSION_CHECK="1",
                        PIP_NO_CACHE_DIR="1", PYTHONDONTWRITEBYTECODE="1",
                        HOME=os.path.dirname(root))

    def run(self, argv, check=True, env=None, timeout=TIMEOUT):
        """Runs argv in the work folder; returns (returncode, output)."""
        proc = subprocess.run(argv, cwd=self.work, env=dict(self.env,
                                                            **(env or {})),
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError("%s exited %d:\n%s"
                                 % (" ".join(argv), proc.returncode,
                                    proc.stdout))
        return proc.returncode, proc.stdout


def timed(what, fn, *args):
    start = time.monotonic()
    result = fn(*args)
    print("wheel_test: %-44s %6.2f s" % (what, time.monotonic() - start),
          flush=True)
    return result


def check_wheel_file(wheel, version):
    """The wheel's name, layout and RECORD (each file's sha256 and size)."""
    name = os.path.basename(wheel)
    assert name == "tether-%s-cp311-cp311-linux_x86_64.whl" % version, name
    dist_info = "tether-%s.dist-info/" % version
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for needed in ["tether/__init__.py", "tether/_C.so",
                       "tether/libtether_grpc.so",
                       "tether/_build.py", "tether/py.typed",
                       "tether/run.py", "tether/bin/tether_run",
                       "tether/rpc/__init__.pyi",
                       "tether/autograd/__init__.pyi",
                       "tether/optim/__init__.pyi",
                       "tether/nn/__init__.pyi"] + [
                           dist_info + f for f in (
                               "METADATA", "WHEEL", "RECORD",
                               "entry_points.txt", "top_level.txt")]:
            assert needed in names, (needed, sorted(names))
        assert not any("tests/" in n or n.endswith(".pyc") for n in names)
        record = archive.read(dist_info + "RECORD").decode().splitlines()
        listed = set()
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            listed.add(path)
            if path == dist_info + "RECORD":
                assert digest == size == "", line
                continue
            data = archive.read(path)
            want = base64.urlsafe_b64encode(
                hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == "sha256=" + want and int(size) == len(data), line
        assert listed == names, names ^ listed
        tags = archive.read(dist_info + "WHEEL").decode()
        assert "Tag: cp311-cp311-linux_x86_64\n" in tags, tags
        meta = archive.read(dist_info + "METADATA").decode()
        assert "Requires-Python: >=3.11,<3.12\n" in meta, meta
        assert "Requires-Dist: torch==1.13.*\n" in meta, meta


def version_from_bzl(path):
    found = re.search(r'^TETHER_VERSION = "([^"]+)"$', open(path).read(),
                      re.M)
    assert found, path
    return found.group(1)


def check_installed(venv, version):
    """Where tether comes from, and the versions everyone reports."""
    _, out = venv.run([venv.python, "-c", """if True:
        import importlib.metadata, json, tether, tether._build, tether._C
        print(json.dumps({
            "file": tether.__file__,
            "version": tether.__version__,
            "metadata": importlib.metadata.version("tether"),
            "cxx": tether._C.__version__,
            "torch_built": tether._build.TORCH_VERSION,
            "torch_compiled": tether._C._torch_version,
        }))"""])
    got = json.loads(out.splitlines()[-1])
    site = os.path.join(venv.root, "lib")
    assert got["file"].startswith(site + os.sep), (got["file"], site)
    _, shown = venv.run([venv.python, "-m", "pip", "show", "tether"])
    pip_version = re.search(r"^Version: (.*)$", shown, re.M).group(1)
    versions = {"pip show": pip_version, "importlib.metadata":
                got["metadata"], "tether.__version__": got["version"],
                "tether._C (C++)": got["cxx"], "tether/version.bzl": version}
    assert len(set(versions.values())) == 1, versions
    assert got["torch_built"] == got["torch_compiled"], got
    return os.path.dirname(got["file"])


def check_libraries(venv, package):
    """The extension, the gRPC plugin and the launcher find every library
    they link on the system, none in Bazel's output tree."""
    for path in (os.path.join(package, "_C.so"),
                 os.path.join(package, "libtether_grpc.so"),
                 os.path.join(package, "bin", "tether_run")):
        _, out = venv.run(["ldd", path])
        assert "not found" not in out, out
        assert "bazel-out" not in out and "_solib" not in out, out


def check_torch_mismatch(venv):
    """A torch of another release is refused at import, by name."""
    fake = os.path.join(venv.work, "other_torch")
    os.makedirs(os.path.join(fake, "torch"))
    with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
        f.write('__version__ = "2.1.0"\n')
    rc, out = venv.run([venv.python, "-c", "import tether"], check=False,
                       env={"PYTHONPATH": fake})
    assert rc != 0, out
    assert "ImportError: tether " in out, out
    assert "built against torch 1.13.0" in out and "torch 2.1.0" in out, out


def rank0_output(out):
    """Rank 0's lines of tether-run's output, without their prefix."""
    return "".join(line[4:] + "\n" for line in out.splitlines()
                   if line.startswith("[0] "))


def run_seed(venv, name, world_size, check):
    script = shutil.copy(os.path.join(EXAMPLES, name), venv.work)
    argv = [os.path.join(venv.root, "bin", "tether-run"), "--nproc",
            str(world_size), "--"]
    for rank in range(world_size):
        argv += (["python", script, str(rank)] +
                 ([":"] if rank + 1 < world_size else []))
    _, out = venv.run(argv)
    check(rank0_output(out))


def run_example(venv):
    script = shutil.copy(os.path.join(EXAMPLES, "pipeline.py"), venv.work)
    _, out = venv.run([venv.python, script],
                      env={"MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(free_port())})
    check_pipeline(out)


def check_types(venv):
    """mypy finds the installed stubs (py.typed, PEP 561): the seed programs
    type-check, and a call the stubs do not allow is an error. torch is read
    as Any (its own types take minutes)."""
    config = os.path.join(venv.work, "mypy.ini")
    with open(config, "w") as f:
        f.write("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n")
    wrong = os.path.join(venv.work, "wrong_types.py")
    with open(wrong, "w") as f:
        f.write("import tether.rpc as rpc\nrpc.shutdown(timeout='soon')\n")
    mypy = [venv.python, "-m", "mypy", "--config-file", config,
            "--cache-dir", os.path.join(venv.work, "mypy_cache")]
    venv.run(mypy + [name for name, _, _ in SEEDS])
    rc, out = venv.run(mypy + [wrong], check=False)
    assert rc == 1 and 'Argument "timeout" to "shutdown" has incompatible ' \
        'type "str"; expected "float"' in out, out


def check_launcher(venv):
    """tether-run and python -m tether.run are the launcher, flags and
    all."""
    _, console = venv.run(["tether-run", "--help"])
    _, module = venv.run([venv.python, "-m", "tether.run", "--help"])
    assert console == module and "--nproc N" in console, (console, module)
    _, out = venv.run([venv.python, "-m", "tether.run", "--nproc", "2",
                       "--", "sh", "-c", 'echo "rank=$RANK of $WORLD_SIZE"'])
    assert "[0] rank=0 of 2" in out and "[1] rank=1 of 2" in out, out


def uninstall(venv, package):
    """pip removes every file it installed. Python then finds no tether, or
    only one outside the venv (a developer's .pth into Debian's
    site-packages, scripts/python_setup.sh, which the venv sees)."""
    venv.run([venv.python, "-m", "pip", "uninstall", "-y", "tether"])
    rc, out = venv.run([venv.python, "-m", "pip", "show", "tether"],
                       check=False)
    assert rc != 0 and "not found: tether" in out, out
    _, out = venv.run([venv.python, "-c", "import importlib.util as u; "
                       "s = u.find_spec('tether'); print(s and s.origin)"])
    origin = out.strip().splitlines()[-1]
    assert origin == "None" or not origin.startswith(venv.root), origin
    assert not os.path.exists(package), package
    assert not os.path.exists(os.path.join(venv.root, "bin", "tether-run"))


def main():
    wheel, version_bzl = (os.path.abspath(p) for p in sys.argv[1:3])
    version = version_from_bzl(version_bzl)
    print("wheel_test: %s, %.1f MiB" % (os.path.basename(wheel),
                                        os.path.getsize(wheel) / 2**20))
    check_wheel_file(wheel, version)
    tmp = os.environ.get("TEST_TMPDIR") or os.path.abspath("wheel_test_tmp")
    root = os.path.join(tmp, "venv")
    for stale in (root, os.path.join(tmp, "work")):
        shutil.rmtree(stale, ignore_errors=True)
    timed("venv --system-site-packages", lambda: subprocess.run(
        [SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", root],
        check=True))
    venv = Venv(root)
    assert os.path.exists(venv.python), root
    timed("pip install --no-index (the wheel)", venv.run,
          [venv.python, "-m", "pip", "install", "--no-index",
           "--no-build-isolation", wheel])
    package = timed("versions agree", check_installed, venv, version)
    timed("ldd: libraries found", check_libraries, venv, package)
    timed("another torch refused", check_torch_mismatch, venv)
    for name, world_size, check in SEEDS:
        timed("tether-run: %s" % name, run_seed, venv, name, world_size,
              check)
    timed("example: pipeline.py", run_example, venv)
    timed("mypy: the installed stubs", check_types, venv)
    timed("tether-run / python -m tether.run", check_launcher, venv)
    timed("pip uninstall", uninstall, venv, package)
    print("wheel_test: OK")


if __name__ == "__main__":
    main()
