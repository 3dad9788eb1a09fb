"""The Python exception a failed tether call raises.

Like the peer, a call raises what the remote function raised when that is a
builtin exception type (ValueError, KeyError, ...), with the remote worker
and traceback in its text; everything else (timeouts, lost peers, refused
functions, bad arguments) is a RuntimeError whose text names the worker and
the function.
"""
import builtins
import re

# absl::StatusCode values (core/ keeps one meaning per code).
UNKNOWN = 2
INVALID_ARGUMENT = 3
NOT_FOUND = 5
PERMISSION_DENIED = 7

_REMOTE_TYPE = re.compile(r"calling '[^']*': ([A-Za-z_][A-Za-z0-9_]*): ")
_NOT_REMOTE = (BaseException, Exception, SystemExit, KeyboardInterrupt,
               GeneratorExit)


def exception_for(code, text):
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
