"""tether-run and ``python -m tether.run``: tether's launcher, as torchrun
is ``python -m torch.distributed.run``.

    tether-run --nproc 2 -- python3 train.py

The same program as Bazel's //tools:tether_run with the same flags
(``tether-run --help``): the wheel carries its binary in tether/bin/, and
this replaces the Python process with it, arguments unchanged.
"""
import os
import sys

BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin",
                      "tether_run")


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    if not os.access(BINARY, os.X_OK):
        sys.exit("tether-run: no launcher binary at %s (the wheel carries "
                 "it; scripts/python_setup.sh copies it into a checkout)"
                 % BINARY)
    os.execv(BINARY, ["tether-run"] + args)


if __name__ == "__main__":
    main()
