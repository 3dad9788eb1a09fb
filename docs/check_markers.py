"""Checks that the documentation and the sources name no work period.

A reference says what exists and why; which numbered issue or work session
a change came from belongs to git history, and the number means nothing to
a reader who has only the repository. This check fails on such markers:
`issue #N` and its plural, `(#N)`, `#N/#M`, `session N`, `Session N`,
`work period N`, `sprint N`, N being digits. `TODO(#N)` stays allowed: it
names an open issue, as STYLE.md asks.

It reads README.md, docs/*.md and every source of the repository
(*.cc, *.h, *.py, *.sh, *.bzl, *.proto, BUILD.bazel, BUILD) and the
sanitizers' suppression files (*.supp), code and comments alike. A marker broken across two lines (`issue` at the end of
one, `#N` at the start of the next, after the comment's `//` or `#`) is
found too, and reported at the line where it starts.

Usage: check_markers.py [REPO_ROOT]
Without REPO_ROOT (as //docs:markers_test runs it) the root is found from
the test's runfiles, as check_references.py finds it. Exits 1, listing
each marker as FILE:LINE: TEXT, if any is found.
"""
import os
import re
import sys

from docs import check_references

SOURCE_SUFFIXES = (".cc", ".h", ".py", ".sh", ".bzl", ".proto", ".supp")
SOURCE_NAMES = ("BUILD.bazel", "BUILD")
# Folders never read: version control and Bazel's output links.
SKIPPED = (".git",)

MARKERS = re.compile(
    r"\bissues?\s+#\s*\d+"            # issue #N, and the plural
    r"|\bissues\s+#"                  # the plural, then the sign
    r"|\bsessions?\s+\d+"             # session N, Session N
    r"|\bwork[-\s]periods?\s+#?\d+"   # work period N
    r"|\bsprints?\s+#?\d+"            # sprint N
    r"|(?<!TODO)\(#\d+[),;:\s]"        # (#N), but not TODO(#N)
    r"|#\d+/#\d+",                    # #N/#M
    re.IGNORECASE)
# What opens a comment line, taken off before lines are joined, so that a
# marker broken across two comment lines reads as one.
COMMENT_LEADER = re.compile(r"^\s*(?://+|#+(?!\d)|\*+|\"\"\"|''')?\s?")


def scanned_files(root):
    """README.md, docs/*.md and the sources, relative to `root`, sorted."""
    files = set(check_references.documents(root))
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs
                            if d not in SKIPPED and not d.startswith("bazel-"))
        for name in names:
            if name.endswith(SOURCE_SUFFIXES) or name in SOURCE_NAMES:
                path = os.path.join(directory, name)
                if os.path.isfile(path):
                    files.add(os.path.relpath(path, root))
    return sorted(files)


def markers(text):
    """(line number, marker) of each work-period marker in `text`."""
    lines = text.split("\n")
    found = {}
    for number, line in enumerate(lines, start=1):
        for match in MARKERS.finditer(line):
            found.setdefault((number, match.start()), match.group(0))
    # Pairs of lines, comment leaders stripped: markers broken by a newline.
    for number in range(1, len(lines)):
        first = lines[number - 1].rstrip()
        second = COMMENT_LEADER.sub("", lines[number], count=1)
        joined = first + " " + second
        for match in MARKERS.finditer(joined):
            if match.start() < len(first) < match.end():
                found.setdefault((number, match.start()), match.group(0))
    return [(number, marker)
            for (number, _), marker in sorted(found.items())]


def main(argv):
    root = (os.path.abspath(argv[1]) if len(argv) > 1
            else check_references.find_root())
    files = scanned_files(root)
    failures = []
    for path in files:
        try:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        for number, marker in markers(text):
            failures.append(f"{path}:{number}: {' '.join(marker.split())}")
    if failures:
        print("These lines name a work period (an issue or session number); "
              "say what the code or the page does instead, and leave the "
              "history to git:")
        print("\n".join(failures))
        return 1
    print(f"checked {len(files)} files: no work-period markers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
