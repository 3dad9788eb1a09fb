"""tether's version: the one place it is written.

Bazel feeds it to the C++ library (tether/version.h, //tether:version), the
Python package (tether.__version__, tether._C.__version__), the wheel's name
and metadata (//python:wheel) and the installed CMake tree's tether.pc
(//cmake:install reads it from tether/version.h)."""

TETHER_VERSION = "0.1.0"
