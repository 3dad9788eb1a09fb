"""tether.checkpoint: checkpoints of a tether.rpc job whose state is spread
over its workers, and resuming from the last complete one: what the peer's
users write by hand with torch.save (docs/python.md, "Checkpoints").

    from tether.checkpoint import Checkpoint, RNGState

    # On each trainer (the members, which save and load together):
    checkpoint = Checkpoint("ckpt", members=["trainer1", "trainer2"])
    checkpoint.add("model", model_rref)        # saved by its owner
    checkpoint.add("optimizer", dist_optim)    # each owner saves its share
    checkpoint.add("rng", RNGState())          # torch's and random's generators
    checkpoint.add("data", sampler)            # anything with state_dict()
    step = checkpoint.load() or 0              # None: nothing saved yet
    for step in range(step + 1, steps + 1):
        ...
        if step % every == 0:
            checkpoint.save(step)

    # On the parameter server, which owns model_rref's module:
    tether.checkpoint.serve("ckpt")

Each item is written by the worker that holds it, so no state crosses the
network to be saved: a member's own items (modules, torch.optim optimizers,
tensors, generators, objects with state_dict() and load_state_dict()) into
its file; the object of an RRef (or a RemoteModule) and each owner's share
of a DistributedOptimizer by its owner, into a file of its own, in the
directories that owner serves. The layout is C++'s (tether/checkpoint.h):

    ckpt/step-00000040/trainer1.pt          trainer1's own items
    ckpt/step-00000040/ps.for-trainer1.pt   what ps holds of trainer1's items
    ckpt/step-00000040/COMPLETE             the members, every file, its size

A file is written to a temporary name in its directory, fsynced, renamed
and the directory fsynced: it is there whole or not at all. A step is
complete once COMPLETE is there, written last by the coordinator (the first
member by name) after every member reported its files and its owners'
written; load() takes the highest complete step and removes the incomplete
ones after it (a job killed while saving), which are never loaded. Files
are torch.save pickles of {item name: state}, read back resolving only the
globals torch.load(weights_only=True) resolves: states are tensors and
plain containers, as state_dict()s are.
"""
import itertools
import os
import pickle
import random
import threading
import time
from collections import namedtuple

import torch
import torch._weights_only_unpickler as _weights_only

from tether import rpc

__all__ = ["Checkpoint", "RNGState", "SavedCheckpoint", "serve", "latest"]

_MARKER = "COMPLETE"
_HEADER = "tether checkpoint 1"

SavedCheckpoint = namedtuple("SavedCheckpoint",
                             ["step", "path", "files", "bytes", "seconds"])
SavedCheckpoint.__doc__ = """What Checkpoint.save wrote: the step, its
directory, the number of files and their bytes (every member's and its
owners'), and the seconds from the moment every member had arrived until
every part was written."""

_served_lock = threading.Lock()
_served = set()


def _normal(directory):
    return os.path.normpath(os.fspath(directory))


def serve(directory):
    """Lets peers' Checkpoints write and read, in ``directory``, the parts
    of the objects this worker owns (a parameter server's modules, the
    optimizers a DistributedOptimizer built here). A worker writes for its
    peers only in the directories it serves; a Checkpoint's member serves
    its own."""
    if not directory:
        raise ValueError("a checkpoint directory cannot be empty")
    with _served_lock:
        _served.add(_normal(directory))


def _check_served(directory):
    with _served_lock:
        if _normal(directory) in _served:
            return
    raise PermissionError(
        "this worker serves no checkpoints in %r: its program calls "
        "tether.checkpoint.serve(%r)" % (directory, directory))


def _escape(name):
    """A worker name as a part of a file name: letters, digits, '_', '-'
    and '.' (but a leading one) stay, any other byte becomes %XX."""
    out = []
    for i, byte in enumerate(name.encode()):
        c = chr(byte)
        if (c.isascii() and c.isalnum()) or c in "_-" or (c == "." and i):
            out.append(c)
        else:
            out.append("%%%02X" % byte)
    return "".join(out)


def _unescape(text):
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            out.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            out += text[i].encode()
            i += 1
    return out.decode()


def _step_directory(directory, step):
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError("a checkpoint's step is an int, 0 or more, not %r"
                         % (step,))
    return os.path.join(_normal(directory), "step-%08d" % step)


def _part_file(holder, member):
    if holder == member:
        return "%s.pt" % _escape(holder)
    return "%s.for-%s.pt" % (_escape(holder), _escape(member))


def _fsync_directory(directory):
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_directories(path):
    """os.makedirs, fsyncing the parent of each directory it makes."""
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        _make_directories(parent)
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    _fsync_directory(parent or ".")


_temporaries = itertools.count()


def _write_atomically(path, write):
    """Calls ``write(file)`` on a temporary file beside ``path``, fsyncs
    it, renames it to ``path`` and fsyncs the directory; returns the size."""
    directory = os.path.dirname(path) or "."
    temporary = os.path.join(directory, ".%s.tmp-%d-%d" % (
        os.path.basename(path), os.getpid(), next(_temporaries)))
    try:
        with open(temporary, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)
    return size


class _Unpickler(pickle.Unpickler):
    """pickle's own unpickler, resolving only the globals torch.load's
    weights_only=True resolves (torch's reviewed list: tensors, storages,
    dtypes, OrderedDict, ...)."""

    def find_class(self, module, name):
        allowed = _weights_only._get_allowed_globals()
        full = "%s.%s" % (module, name)
        if full not in allowed:
            raise pickle.UnpicklingError(
                "a checkpoint holds %s, which tether.checkpoint does not "
                "load: states are tensors and plain containers, as "
                "state_dict()s are" % full)
        return allowed[full]


class _RestrictedPickle:
    """The pickle_module torch's loader takes."""
    Unpickler = _Unpickler


def _torch_load(path):
    """torch.load(path, weights_only=True). torch 1.13's weights_only
    unpickler lacks opcodes that a torch.optim state_dict() needs
    (BINFLOAT), and its torch.load ignores a pickle_module without
    weights_only: there, the zip file is read by torch's own loader with
    the unpickler above."""
    if hasattr(_weights_only, "BINFLOAT"):
        return torch.load(path, weights_only=True)
    with open(path, "rb") as f, \
            torch.serialization._open_zipfile_reader(f) as zip_file:
        return torch.serialization._load(zip_file, None, _RestrictedPickle,
                                         encoding="utf-8")


def _save(path, value):
    return _write_atomically(path, lambda f: torch.save(value, f))


def _load(path, size):
    """The {name: state} dict of a part, checked against the size its
    marker lists."""
    actual = os.path.getsize(path)
    if actual != size:
        raise ValueError("%r is %d bytes, the checkpoint's marker lists %d"
                         % (path, actual, size))
    part = _torch_load(path)
    if not isinstance(part, dict):
        raise ValueError("%r holds no dict of items" % path)
    return part


def _state_of(value):
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, torch.Generator):
        return value.get_state()
    if callable(getattr(value, "state_dict", None)):
        return value.state_dict()
    raise TypeError("a %s is neither a tensor, a generator nor an object "
                    "with state_dict()" % type(value).__qualname__)


def _load_into(value, state):
    if isinstance(value, torch.Tensor):
        if tuple(state.shape) != tuple(value.shape):
            raise ValueError("the checkpoint's tensor is %s, this one %s"
                             % (list(state.shape), list(value.shape)))
        with torch.no_grad():
            value.copy_(state)
    elif isinstance(value, torch.Generator):
        value.set_state(state)
    elif callable(getattr(value, "load_state_dict", None)):
        value.load_state_dict(state)
    else:
        _state_of(value)  # raises, saying why


def _in_item(name, error):
    """``error`` again, of its type when it can be, naming the item."""
    text = "item %r: %s" % (name, error)
    try:
        return type(error)(text)
    except Exception:
        return RuntimeError(text)


def _find(part, name, path):
    if name not in part:
        raise ValueError("%r has no item %r" % (path, name))
    return part[name]


def _owned(items):
    """{name: the value this worker owns} of ``items``, {name: RRef}."""
    return {name: rref.local_value() for name, rref in items.items()}


def _write_part(directory, step, member, items):
    """On an owner: writes the state of ``items`` as ``member``'s part of
    ``step``; returns its size."""
    _check_served(directory)
    part = {}
    for name, value in _owned(items).items():
        try:
            part[name] = _state_of(value)
        except Exception as e:
            raise _in_item(name, e) from e
    step_dir = _step_directory(directory, step)
    _make_directories(step_dir)
    me = rpc.get_worker_info().name
    return _save(os.path.join(step_dir, _part_file(me, member)), part)


def _read_part(directory, step, member, size, items):
    """On an owner: loads ``member``'s part of ``step`` into ``items``."""
    _check_served(directory)
    me = rpc.get_worker_info().name
    path = os.path.join(_step_directory(directory, step),
                        _part_file(me, member))
    part = _load(path, size)
    for name, value in _owned(items).items():
        state = _find(part, name, path)
        try:
            _load_into(value, state)
        except Exception as e:
            raise _in_item(name, e) from e


def _settled(error, results, futures):
    """Waits for every (key, future) of ``futures``, putting each value
    into ``results`` under its key (None: dropped); raises ``error``, else
    the first future's; returns ``results``."""
    for key, future in futures:
        try:
            value = future.wait()
            if key is not None:
                results[key] = value
        except Exception as e:
            error = error or e
    if error is not None:
        raise error
    return results


def _steps(directory):
    """(every step directory's step, the complete ones), ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return [], []
    steps, complete = [], []
    for name in names:
        digits = name[len("step-"):]
        path = os.path.join(directory, name)
        if (not name.startswith("step-") or not digits.isdigit()
                or not digits.isascii() or len(digits) > 18
                or not os.path.isdir(path)):
            continue
        steps.append(int(digits))
        if os.path.exists(os.path.join(path, _MARKER)):
            complete.append(int(digits))
    return sorted(steps), sorted(complete)


def latest(directory):
    """The highest complete step in ``directory``, or None."""
    complete = _steps(directory)[1]
    return complete[-1] if complete else None


def _remove_step(path):
    """Removes a step's directory, its marker first: a crash midway leaves
    an incomplete step, never a complete one with files missing."""
    try:
        os.unlink(os.path.join(path, _MARKER))
    except FileNotFoundError:
        pass
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(path)
    _fsync_directory(os.path.dirname(path) or ".")


def _format_manifest(step, members, files):
    lines = [_HEADER, "step %d" % step]
    lines += ["member %s" % _escape(m) for m in members]
    lines += ["file %s %d" % (f, files[f]) for f in sorted(files)]
    return "\n".join(lines) + "\n"


def _parse_manifest(text, where):
    lines = [line for line in text.split("\n") if line]
    if not lines or lines[0] != _HEADER:
        raise ValueError("%r is not a checkpoint's marker: it does not start "
                         "with %r" % (where, _HEADER))
    step, members, files = None, [], {}
    for number, line in enumerate(lines[1:], 2):
        words = line.split(" ")
        if len(words) == 2 and words[0] == "step" and step is None:
            step = int(words[1])
        elif len(words) == 2 and words[0] == "member":
            members.append(_unescape(words[1]))
        elif len(words) == 3 and words[0] == "file" and words[2].isdigit():
            files[words[1]] = int(words[2])
        else:
            raise ValueError("%r is not a checkpoint's marker: line %d is %r"
                             % (where, number, line))
    if step is None:
        raise ValueError("%r is not a checkpoint's marker: it names no step"
                         % where)
    return step, members, files


def _latest_manifest(directory):
    """(step, members, files) of the highest complete step (step -1 if
    none), once the directories of later, incomplete, steps are gone."""
    steps, complete = _steps(directory)
    step, members, files = -1, [], {}
    if complete:
        marker = os.path.join(_step_directory(directory, complete[-1]),
                              _MARKER)
        with open(marker) as f:
            step, members, files = _parse_manifest(f.read(), marker)
        if step != complete[-1]:
            raise ValueError("%r names step %d" % (marker, step))
    for later in steps:
        if later > step:
            _remove_step(_step_directory(directory, later))
    return step, members, files


class RNGState:
    """The global random generators as one checkpoint item: torch's
    (torch.get_rng_state) and Python's random module's."""

    def state_dict(self):
        version, state, gauss = random.getstate()
        return {"torch": torch.get_rng_state(),
                "random": [version, list(state), gauss]}

    def load_state_dict(self, state):
        torch.set_rng_state(state["torch"])
        version, internal, gauss = state["random"]
        random.setstate((version, tuple(internal), gauss))


class Checkpoint:
    """What this worker saves, by name, with the other ``members`` (worker
    names, this one among them; default: this worker alone). ``keep``: how
    many complete checkpoints to keep, the newest (0: every one; older ones
    go once a new one is complete, from the coordinator's directory).
    ``timeout``: seconds each owner's write or read may take (-1: the RPC
    timeout, 0: none).

    save() and load() are collective: every member calls them in the same
    order. Errors: every member raises if one failed (the one that failed
    its own error, naming the item; the others a RuntimeError naming the
    member)."""

    def __init__(self, directory, members=None, keep=0,
                 timeout=rpc.UNSET_RPC_TIMEOUT):
        if not directory:
            raise ValueError("a checkpoint directory cannot be empty")
        if keep < 0:
            raise ValueError("keep must be 0 or more, not %r" % (keep,))
        self.directory = os.fspath(directory)
        self._me = rpc.get_worker_info().name
        members = list(members) if members else [self._me]
        if len(set(members)) != len(members):
            raise ValueError("the members name a worker twice: %r"
                             % (members,))
        if self._me not in members:
            raise ValueError("the members %r leave out %s, which makes the "
                             "checkpoint" % (members, self._me))
        for member in members:
            rpc.get_worker_info(member)  # raises for an unknown one
        self._members = sorted(members)
        self._keep = keep
        self._timeout = timeout
        self._local = {}   # name -> object of this worker
        self._remote = []  # (name, RRef)
        serve(self.directory)

    def add(self, name, item):
        """Adds ``item`` under ``name``: an RRef (or RemoteModule), whose
        owner saves its object (a tensor or anything with state_dict() and
        load_state_dict()); a tether DistributedOptimizer, whose owners
        each save their share; or, saved by this worker, a tensor, a
        torch.Generator, or any object with state_dict() and
        load_state_dict(state) (nn.Module, torch.optim optimizers, your data
        position)."""
        from tether import optim
        from tether.nn.api.remote_module import RemoteModule
        if not name or not isinstance(name, str):
            raise ValueError("a checkpoint item needs a name, got %r"
                             % (name,))
        if name in self._local or any(n == name for n, _ in self._remote):
            raise ValueError("the checkpoint has an item %r already" % name)
        if isinstance(item, RemoteModule):
            item = item.get_module_rref()
        if isinstance(item, rpc.RRef):
            self._remote.append((name, item))
        elif isinstance(item, optim.DistributedOptimizer):
            # One optimizer per owner: the name is unique in each part.
            self._remote += [(name, r) for r in item._local_optimizers()]
        elif isinstance(item, (torch.Tensor, torch.Generator)) or (
                callable(getattr(item, "state_dict", None))
                and callable(getattr(item, "load_state_dict", None))):
            self._local[name] = item
        else:
            raise TypeError(
                "item %r is a %s: a checkpoint saves tensors, generators, "
                "objects with state_dict() and load_state_dict(), RRefs and "
                "DistributedOptimizers" % (name, type(item).__qualname__))

    # ---- collective steps -------------------------------------------------

    def _gather(self, mine):
        if len(self._members) == 1:
            return {self._me: mine}
        return rpc._all_gather(mine, self._members)

    def _exchange(self, error, files):
        """Every member's outcome to every member: raises if one failed (the
        one that failed its own error), else {file: size} of all."""
        everyone = self._gather(
            ("" if error is None else "%s: %s" % (type(error).__name__, error),
             files))
        if error is not None:
            raise error
        every = {}
        for member in sorted(everyone):
            failed, theirs = everyone[member]
            if failed:
                raise RuntimeError("checkpoint member %s: %s"
                                   % (member, failed))
            every.update(theirs)
        return every

    def _by_owner(self):
        """{owner's name: {item name: RRef}} of the items others own."""
        out = {}
        for name, rref in self._remote:
            owner = rref.owner().name
            if owner != self._me:
                out.setdefault(owner, {})[name] = rref
        return out

    def _mine(self):
        """{name: object} of the items this worker holds."""
        mine = dict(self._local)
        for name, rref in self._remote:
            if rref.owner().name == self._me:
                mine[name] = rref.local_value()
        return mine

    def _write_parts(self, step):
        step_dir = _step_directory(self.directory, step)
        _make_directories(step_dir)
        writes = [(owner, rpc.rpc_async(
            owner, _write_part,
            args=(self.directory, step, self._me, items),
            timeout=self._timeout))
            for owner, items in self._by_owner().items()]
        files, error = {}, None
        try:
            part = {}
            for name, value in self._mine().items():
                try:
                    part[name] = _state_of(value)
                except Exception as e:
                    raise _in_item(name, e) from e
            own = _part_file(self._me, self._me)
            files[own] = _save(os.path.join(step_dir, own), part)
        except Exception as e:
            error = e
        return _settled(error, files, [
            (_part_file(owner, self._me), write) for owner, write in writes])

    def _read_parts(self, step, files):
        step_dir = _step_directory(self.directory, step)

        def listed(name):
            if name not in files:
                raise ValueError("the checkpoint of step %d has no part %r"
                                 % (step, name))
            return files[name]

        parts = [(owner, listed(_part_file(owner, self._me)), items)
                 for owner, items in self._by_owner().items()]
        reads = [rpc.rpc_async(
            owner, _read_part,
            args=(self.directory, step, self._me, size, items),
            timeout=self._timeout)
            for owner, size, items in parts]
        error = None
        try:
            own = _part_file(self._me, self._me)
            path = os.path.join(step_dir, own)
            part = _load(path, listed(own))
            for name, value in self._mine().items():
                state = _find(part, name, path)
                try:
                    _load_into(value, state)
                except Exception as e:
                    raise _in_item(name, e) from e
        except Exception as e:
            error = e
        _settled(error, {}, [(None, read) for read in reads])

    def save(self, step):
        """Saves every member's items as checkpoint ``step``; returns once
        every member's parts are written, with a SavedCheckpoint of what all
        of them wrote. The coordinator writes the marker before it
        returns."""
        path = _step_directory(self.directory, step)  # checks the step
        if len(self._members) > 1:
            # Every member is at `step` before an owner writes: another
            # member's step could still change what the owner holds.
            rpc._barrier(self._members)
        start = time.monotonic()
        error, files = None, {}
        try:
            files = self._write_parts(step)
        except Exception as e:
            error = e
        every = self._exchange(error, files)
        if self._me == self._members[0]:
            text = _format_manifest(step, self._members, every)
            _write_atomically(os.path.join(path, _MARKER),
                              lambda f: f.write(text.encode()))
            self._prune()
        return SavedCheckpoint(step, path, len(every), sum(every.values()),
                               time.monotonic() - start)

    def _prune(self):
        if not self._keep:
            return
        complete = _steps(self.directory)[1]
        for step in complete[:-self._keep]:
            _remove_step(_step_directory(self.directory, step))

    def load(self):
        """Loads the highest complete checkpoint into every member's items
        and returns its step, or None if there is none (nothing loaded);
        every member returns once every member has loaded."""
        error, chosen = None, (-1, [], {})
        if self._me == self._members[0]:
            try:
                chosen = _latest_manifest(self.directory)
            except Exception as e:
                error = e
        everyone = self._gather(
            ("" if error is None else "%s: %s" % (type(error).__name__, error),
             chosen))
        if error is not None:
            raise error
        failed, (step, saved_by, files) = everyone[self._members[0]]
        if failed:
            raise RuntimeError("checkpoint member %s: %s"
                               % (self._members[0], failed))
        if step < 0:
            return None
        error = None
        try:
            if sorted(saved_by) != self._members:
                raise ValueError(
                    "the checkpoint of step %d was saved by %s; this job's "
                    "members are %s" % (step, ", ".join(saved_by),
                                        ", ".join(self._members)))
            self._read_parts(step, files)
        except Exception as e:
            error = e
        # Every member loaded before any trains on: the exchange is the
        # barrier.
        self._exchange(error, {})
        return step
