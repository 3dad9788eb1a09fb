"""The Python exception a failed tether call raises.

Like the peer, a call raises what the remote function raised when that is a
builtin exception type (ValueError, KeyError, ...), with the remote worker
and traceback in its text; a call that ran past its timeout is a
TimeoutError that is also a RuntimeError (the peer raises RuntimeError; its
text starts as the peer's, "RPC ran for more than set timeout (N ms)");
everything else (lost peers, refused functions, bad arguments) is a
RuntimeError whose text names the worker and the function.
"""
import builtins
import re

# absl::StatusCode values (core/ keeps one meaning per code).
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8

# tether's call timeouts: "<call> timed out after <absl duration>".
_CALL_TIMEOUT = re.compile(r"timed out after ((?:[0-9.]+(?:h|ms|us|ns|m|s))+)")
_DURATION_PART = re.compile(r"([0-9.]+)(h|ms|us|ns|m|s)")
_MS_PER_UNIT = {"h": 3600e3, "m": 60e3, "s": 1e3, "ms": 1.0, "us": 1e-3,
                "ns": 1e-6}


class RpcTimeoutError(RuntimeError, TimeoutError):
    """A call ran past its timeout. A RuntimeError, as the peer raises, and
    a TimeoutError, as Python names it."""


def _timeout_error(text):
    match = _CALL_TIMEOUT.search(text)
    if match is None or text.startswith(("rendezvous", "join")):
        return None
    ms = sum(float(n) * _MS_PER_UNIT[unit]
             for n, unit in _DURATION_PART.findall(match.group(1)))
    return RpcTimeoutError(
        "RPC ran for more than set timeout (%d ms) and will now be marked "
        "with an error: %s" % (round(ms), text))


_REMOTE_TYPE = re.compile(r"calling '[^']*': ([A-Za-z_][A-Za-z0-9_]*): ")
_NOT_REMOTE = (BaseException, Exception, SystemExit, KeyboardInterrupt,
               GeneratorExit)


def exception_for(code, text):
    if code == DEADLINE_EXCEEDED:
        error = _timeout_error(text)
        if error is not None:
            return error
    if code == UNKNOWN:
        match = _REMOTE_TYPE.search(text)
        if match:
            kind = getattr(builtins, match.group(1), None)
            if (isinstance(kind, type) and issubclass(kind, Exception)
                    and kind not in _NOT_REMOTE):
                try:
                    return kind(text)
                except Exception:  # a type that needs other arguments
                    pass
    return RuntimeError(text)
