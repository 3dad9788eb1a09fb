"""The peer's programs of examples/python/ for seeds_test.py: the same
files made the peer's (torch.distributed.rpc) by their import lines."""
import os
import re

import workers

EXAMPLES = os.path.join(workers.REPO, "examples", "python")


def peer_version(path, tmp_path):
    """The program with its tether imports made the peer's; every other
    line is left as it is. It keeps its file name in `tmp_path`, so a
    program's own modules, made the peer's beside it, import as they are
    named."""
    lines = open(path).read().splitlines(keepends=True)
    swapped = 0
    for i, line in enumerate(lines):
        if line.startswith(("import tether.", "from tether.")):
            lines[i] = line.replace("tether.", "torch.distributed.", 1)
            swapped += 1
    assert swapped > 0
    code = [l for l in lines if not l.startswith(("import ", "from "))]
    assert not any(re.search(r"\btether\b", l) for l in code
                   if not l.lstrip().startswith(("#", '"""'))
                   and "TETHER_BACKEND" not in l), "tether outside imports"
    peer = tmp_path / os.path.basename(path)
    assert not peer.exists(), peer
    peer.write_text("".join(lines))
    return str(peer)
