"""Checks that the documentation names only repository files that exist.

Reads README.md and docs/*.md and finds the repository paths they name:
in `backticks` and fenced code blocks (each word that looks like a path),
in Markdown links and images ([text](target), relative to the document),
and Bazel labels (//package:target, whose package must exist). A path counts
as the repository's when its first part is one of the repository's
top-level entries (core/..., backends/..., docs/...); everything else is
left alone: URLs, absolute paths (/usr/...), other projects' paths
(torch/testing/..., absl/status/status.h, bazel-bin/...), store keys and
templates with placeholders (tether/join/<scope>/). A path may end in a
line number (core/worker.cc:293) or hold a glob (docs/*.md); a path that
names a program may omit its source's extension (tools/bench_worker for
tools/bench_worker.cc).

Usage: check_references.py [REPO_ROOT]
Without REPO_ROOT (as //docs:references_test runs it) the root is found
from the test's runfiles: README.md there is a link to the checkout's own.
Exits 1, listing each broken reference as FILE:LINE: PATH, if any is found.
"""
import glob
import os
import re
import sys

# Extensions a program's name may stand for (tools/bench_worker).
PROGRAM_SOURCES = (".cc", ".py", ".sh")
# Characters a path word may hold; a word with others ($, %, <, {) is a
# template or a shell expression, not a file name.
PATH_WORD = re.compile(r"^[A-Za-z0-9_.+\-/*]+$")
LABEL = re.compile(r"^@?//([A-Za-z0-9_.\-/]*)(?::([A-Za-z0-9_.+\-/%]+))?$")
LINE_SUFFIX = re.compile(r":\d+(-\d+)?$")
MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# Punctuation around a word in prose or commands.
STRIP = "\"'`,;()[]{}<>"


def find_root():
    """The checkout the test's runfiles link to."""
    srcdir = os.environ.get("TEST_SRCDIR")
    workspace = os.environ.get("TEST_WORKSPACE", "tether")
    if not srcdir:
        sys.exit("check_references.py: give the repository's root "
                 "(not run by bazel test, so TEST_SRCDIR is unset)")
    readme = os.path.join(srcdir, workspace, "README.md")
    if not os.path.exists(readme):
        sys.exit(f"check_references.py: {readme} is missing: the test's data "
                 "must hold //:README.md")
    root = os.path.dirname(os.path.realpath(readme))
    if not os.path.isfile(os.path.join(root, "WORKSPACE")):
        sys.exit(f"check_references.py: README.md links to {root}, which "
                 "holds no WORKSPACE: cannot find the checkout")
    return root


def top_level(root):
    """The repository's top-level entries (bazel-* output links left out)."""
    return {name for name in os.listdir(root)
            if not name.startswith("bazel-") and name != ".git"}


def exists(root, path):
    """Whether `path` (relative to `root`) names something in the checkout."""
    full = os.path.join(root, path)
    if any(c in path for c in "*?"):
        return bool(glob.glob(full))
    if os.path.exists(full):
        return True
    return any(os.path.isfile(full + ext) for ext in PROGRAM_SOURCES)


def macro_names(text, macro, argument=None):
    """The names of the calls of backends/backend_tests.bzl's `macro` in a
    BUILD file's text (`tether_<macro>(` or `tether.<macro>(`, up to the
    call's closing parenthesis at the start of a line); with `argument`, only
    the calls whose arguments match that pattern."""
    names = []
    for call in re.finditer(r"\btether[._]" + macro + r"\((.*?)^\)", text,
                            re.S | re.M):
        name = re.search(r"\bname\s*=\s*\"([^\"]+)\"", call.group(1))
        if name and (argument is None or re.search(argument, call.group(1))):
            names.append(name.group(1))
    return names


def target_names(build_file):
    """Patterns of the target names a BUILD file declares: the literal
    `name = "..."` values, with a name a comprehension formats
    ("%s_scenarios_%s_test") matching any text in place of each %s. A name
    given by a variable (`name = test`) could be anything: then any name
    matches. The macros of backends/backend_tests.bzl (called as
    `tether_fuzz_test` or `tether.fuzz_test`) declare more:
    `fuzz_test(name = "x")` also x_smoke_test,
    `backend_tests(name = "x")` only targets x_..._test,
    `unit(name = "x", test = True)` also x_test, and
    `backend_library(name = "x")` also agent_state and settings. The files
    in a rule's `outs = [...]` are targets too."""
    with open(build_file, encoding="utf-8") as f:
        text = f.read()
    if re.search(r"\bname\s*=\s*[A-Za-z_]", text):
        return [re.compile(".*")]
    names = re.findall(r"\bname\s*=\s*\"([^\"]+)\"", text)
    # Files a rule writes (a genrule's outs: //tether:version.h).
    for outs in re.findall(r"\bouts\s*=\s*\[([^\]]*)\]", text):
        names += re.findall(r"\"([^\"]+)\"", outs)
    names += [name + "_smoke_test" for name in macro_names(text, "fuzz_test")]
    names += [name + "_%s_test"
              for name in macro_names(text, "backend_tests")]
    names += [name + "_test"
              for name in macro_names(text, "unit", r"\btest\s*=\s*True")]
    if macro_names(text, "backend_library"):
        names += ["agent_state", "settings"]
    return [re.compile("^" + ".+".join(re.escape(part)
                                        for part in name.split("%s")) + "$")
            for name in names]


def check_label(root, word):
    """None if `word` is not a label of this repository, else whether its
    package exists and declares the target (or holds it as a file)."""
    match = LABEL.match(word)
    if not match or word.startswith("@"):
        return None
    package, target = match.group(1), match.group(2)
    if package.endswith("/...") or package == "...":
        package = package[:-len("...")].rstrip("/")
        target = None
    directory = os.path.join(root, package)
    builds = [os.path.join(directory, build)
              for build in ("BUILD.bazel", "BUILD")
              if os.path.isfile(os.path.join(directory, build))]
    if not builds:
        return False
    if target is None:
        # //package names the target named after the package's folder.
        target = os.path.basename(package) if package else None
    if target is None or target in ("all", "*", "all-targets"):
        return True
    if os.path.exists(os.path.join(directory, target)):
        return True
    return any(pattern.match(target) for pattern in target_names(builds[0]))


def check_word(root, tops, word):
    """None if `word` names no repository path; else whether it exists."""
    word = word.strip(STRIP).rstrip(".:")
    if word.startswith("--") and "=" in word:
        word = word.split("=", 1)[1]
    if not word or "://" in word:
        return None
    if word.startswith("//") or word.startswith("@//"):
        return check_label(root, word)
    if word.startswith("./"):
        word = word[2:]
    word = LINE_SUFFIX.sub("", word)
    if "/" not in word or word.startswith("/") or not PATH_WORD.match(word):
        return None
    if word.split("/", 1)[0] not in tops:
        return None
    return exists(root, word.rstrip("/") or word)


def check_link(root, doc_dir, target):
    """None for links outside the checkout; else whether the target exists."""
    if re.match(r"^[a-z]+:", target) or target.startswith("#"):
        return None
    target = target.split("#", 1)[0]
    if not target or target.startswith("/"):
        return None
    full = os.path.normpath(os.path.join(doc_dir, target))
    if os.path.relpath(full, root).startswith(".."):
        return None
    return os.path.exists(full)


def broken_references(root, doc):
    """(line number, reference) of each broken reference in `doc`."""
    tops = top_level(root)
    doc_dir = os.path.dirname(os.path.join(root, doc))
    broken = []
    in_fence = False
    with open(os.path.join(root, doc), encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
                continue
            words = []
            if in_fence:
                words = line.split()
            else:
                for span in CODE_SPAN.finditer(line):
                    words.extend(span.group(2).split())
                for link in MD_LINK.finditer(line):
                    if check_link(root, doc_dir, link.group(1)) is False:
                        broken.append((number, link.group(1)))
            for word in words:
                if check_word(root, tops, word) is False:
                    broken.append((number, word.strip(STRIP)))
    return broken


def documents(root):
    docs = ["README.md"]
    docs += sorted(os.path.relpath(p, root)
                   for p in glob.glob(os.path.join(root, "docs", "*.md")))
    return docs


def main(argv):
    root = os.path.abspath(argv[1]) if len(argv) > 1 else find_root()
    docs = documents(root)
    failures = []
    for doc in docs:
        for number, reference in broken_references(root, doc):
            failures.append(f"{doc}:{number}: {reference}")
    if failures:
        print("These documents name repository files that do not exist:")
        print("\n".join(failures))
        return 1
    print(f"checked {len(docs)} documents: every repository path they name "
          "exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
