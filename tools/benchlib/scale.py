"""The scale workload (up to 64 workers on one machine), for bench --scale.

For each backend variant and world size N, tether_run starts N
scale_worker processes (tools/scale_worker.cc) on this machine; each joins
the group, runs a cold and then warm all-to-all rounds (every rank calling
every other at once) and prints one JSON line. Per variant and N this keeps
the median and the maximum over the ranks of: init time, the rounds, open
fds and VmHWM, and from the wall clock: launch (tether_run started) to the
last rank up. A "bare" row per N is the floor every backend stands on:
launch to the last of N processes that only load scale_worker's libraries
(LibTorch's among them) and exit, and the CPU time a process has used when
main() begins.

Per-peer growth (the target: "a few fds and 1 MB per peer") is the slope
between the smallest and the largest world size that came up.
"""
import json
import os
import re
import time
from statistics import median

from .processes import run, tail

# The variants run by default (labels of VARIANTS); --backends
# picks others by label or by backend name.
SCALE_DEFAULT = ["tensorpipe negotiated", "grpc", "libfabric tcp;ofi_rxm",
                 "libfabric shm"]

RANK_LINE = re.compile(r"^\[(\d+)\] JSON (\{.*\})\s*$")

# (key in a rank's line, key in the summary, scale factor).
PER_RANK = [
    ("init_s", "init_s", 1),
    ("all_up_barrier_s", "all_up_barrier_s", 1),
    ("cold_round_s", "cold_round_s", 1),
    ("warm_round_s", "warm_round_s", 1),
    ("fds", "fds", 1),
    ("fds_up", "fds_up", 1),
    ("vmhwm_kb", "vmhwm_MB", 1 / 1024),
    ("vmrss_kb", "vmrss_MB", 1 / 1024),
    ("rss_at_main_kb", "rss_at_main_MB", 1 / 1024),
    ("threads", "threads", 1),
    ("shutdown_s", "shutdown_s", 1),
    ("cpu_s_at_main", "cpu_s_at_main", 1),
    ("shared_libraries", "shared_libraries", 1),
    ("shared_libraries_up", "shared_libraries_up", 1),
]


def parse_sizes(text):
    sizes = []
    for word in text.split(","):
        if not word.strip().isdigit() or int(word) < 2:
            raise ValueError("--scale takes world sizes of at least 2, "
                             "comma-separated: %r is not one" % word)
        sizes.append(int(word))
    return sorted(set(sizes))


def pick_variants(variants, backends):
    """Labels of `variants` (VARIANTS) to run: SCALE_DEFAULT, or for each word
    of `backends` the label it names or the default labels of the backend it
    names."""
    if not backends:
        return list(SCALE_DEFAULT)
    by_label = {v[0]: v for v in variants}
    picked = []
    for word in backends:
        if word in by_label:
            labels = [word]
        else:
            labels = [l for l in SCALE_DEFAULT if by_label[l][1] == word] or [
                v[0] for v in variants if v[1] == word]
        if not labels:
            raise ValueError("--backends: %r is neither a variant (%s) nor a "
                             "backend" % (word, ", ".join(by_label)))
        picked += [l for l in labels if l not in picked]
    return picked


def rank_lines(out):
    """{rank: object} of the ranks' JSON lines in tether_run's output."""
    ranks = {}
    for line in out.splitlines():
        m = RANK_LINE.match(line)
        if m:
            try:
                ranks[int(m.group(1))] = json.loads(m.group(2))
            except ValueError:
                pass
    return ranks


def failure_lines(out, limit=3):
    """The first distinct lines of the output that say what failed."""
    seen = []
    for line in out.splitlines():
        text = re.sub(r"^\[\d+\] ", "", line)
        if (re.search(r"failed|error|Error|timed out|refus|abort", text) or
                re.match(r"[WEF]\d{8} ", text)) and not text.startswith("JSON"):
            key = re.sub(r"\d+", "#", text)
            if key not in [k for k, _ in seen]:
                seen.append((key, line.strip()))
        if len(seen) >= limit:
            break
    return [l for _, l in seen]


def summarize(n, ranks, launched, wall, code, out, err, tail):
    """One world's record from its ranks' lines."""
    record = {"world_size": n, "ranks_reported": len(ranks),
              "wall_s": wall, "loadavg_at_start": None}
    for key, name, factor in PER_RANK:
        values = [r[key] * factor for r in ranks.values() if key in r]
        if values:
            record[name + "_median"] = median(values)
            record[name + "_max"] = max(values)
    mains = [r["main_unix"] for r in ranks.values() if "main_unix" in r]
    ups = [r["up_unix"] for r in ranks.values() if "up_unix" in r]
    if len(mains) == n:
        record["launch_to_all_main_s"] = max(mains) - launched
    if len(ups) == n:
        record["launch_to_all_up_s"] = max(ups) - launched
    failed = {rank: r["status"] for rank, r in sorted(ranks.items())
              if r.get("status") != "ok"}
    if code == 0 and len(ranks) == n and not failed:
        record["status"] = "ok"
        return record
    why = []
    if code is None:
        why.append("timed out after %.0f s" % wall)
    elif code != 0:
        why.append("tether_run exit %s" % code)
    if len(ranks) < n:
        why.append("%d of %d ranks reported" % (len(ranks), n))
    for rank, status in list(failed.items())[:3]:
        why.append("rank %d: %s" % (rank, status))
    if not failed:
        why += failure_lines(out + "\n" + err) or [tail(err + out)]
    record["status"] = "failed: " + "; ".join(why)
    # What the workers logged (glog warnings and errors, first of each kind).
    record["log_excerpt"] = failure_lines(out + "\n" + err, limit=8)
    if failed:
        record["ranks_failed"] = len(failed)
    return record


def run_world(args, name, n, worker_argv, env):
    command = [args.tether_run, "--nproc", str(n), "--"] + worker_argv
    load = os.getloadavg()[0]
    launched = time.time()
    code, out, err = run(command, args.scale_timeout, env)
    wall = time.time() - launched
    if args.scale_logs:
        # Every world's whole output, to read what a failed one logged.
        os.makedirs(args.scale_logs, exist_ok=True)
        path = os.path.join(args.scale_logs, "%s_%d.log" % (
            re.sub(r"[^A-Za-z0-9]+", "_", name), n))
        with open(path, "w") as f:
            f.write(out + err)
    record = summarize(n, rank_lines(out), launched, wall, code, out, err,
                       tail)
    record["loadavg_at_start"] = load
    return record


def run_scale(args, variants, log):
    """{"sizes", "bare": {N: record}, "variants": {label: {N: record}}}."""
    by_label = {v[0]: v for v in variants}
    labels = pick_variants(variants, args.backends)
    scale = {"sizes": args.scale, "cpus": os.cpu_count(), "bare": {},
             "variants": {}}
    for n in args.scale:
        rec = run_world(args, "bare", n,
                        [args.scale_worker, "--bare"], {})
        scale["bare"][str(n)] = rec
        log("scale %-22s %3d  %-10s launch to all at main %s s, load %.1f" % (
            "bare", n, rec["status"][:40],
            "%.1f" % rec["launch_to_all_main_s"]
            if "launch_to_all_main_s" in rec else "?", rec["loadavg_at_start"]))
    for label in labels:
        _, backend, settings, env = by_label[label]
        argv = [args.scale_worker, "--backend=" + backend, "--label=" + label]
        argv += ["--setting=%s=%s" % kv for kv in sorted(settings.items())]
        per_n = scale["variants"].setdefault(label, {})
        for n in args.scale:
            rec = run_world(args, label, n, argv, env)
            per_n[str(n)] = rec
            log("scale %-22s %3d  %-10s up %s s, warm %s s, wall %.0f s, "
                "load %.1f" % (
                    label, n, rec["status"][:60],
                    fmt(rec.get("launch_to_all_up_s")),
                    fmt(rec.get("warm_round_s_max")), rec["wall_s"],
                    rec["loadavg_at_start"]))
            if rec["status"] != "ok":
                log("    " + rec["status"])
    return scale


def merge_scale(earlier, scale):
    """`scale` (a run of some variants: --backends) over the scale section
    of an earlier run: its variants' rows replace the earlier ones, the
    other variants' stay, and "earlier" says which rows came from which
    run (command, date, load, and that run's bare floor)."""
    if not earlier:
        return scale
    kept = [label for label in earlier.get("variants", {})
            if label not in scale["variants"]]
    if not kept:
        return scale
    merged = dict(scale)
    # In the earlier run's order, then the new variants.
    order = list(earlier["variants"]) + [
        label for label in scale["variants"] if label not in earlier["variants"]]
    merged["variants"] = {
        label: (scale["variants"][label] if label in scale["variants"]
                else earlier["variants"][label])
        for label in order}
    runs = list(earlier.get("earlier", []))
    runs = [dict(r, variants=[v for v in r["variants"] if v in kept])
            for r in runs]
    mine = [v for v in kept
            if not any(v in r["variants"] for r in runs)]
    runs.append({k: earlier.get(k) for k in
                 ("command", "date", "loadavg_at_start", "loadavg_at_end",
                  "bare")})
    runs[-1]["variants"] = mine
    merged["earlier"] = [r for r in runs if r["variants"]]
    return merged


# ---- per-peer growth and the table ----

def growth(per_n):
    """(fds per peer, VmHWM MB per peer, from N, to N) between the smallest
    and the largest world size that came up, or None."""
    up = sorted((int(n), r) for n, r in per_n.items() if r["status"] == "ok")
    if len(up) < 2:
        return None
    (n1, a), (n2, b) = up[0], up[-1]
    return ((b["fds_median"] - a["fds_median"]) / (n2 - n1),
            (b["vmhwm_MB_median"] - a["vmhwm_MB_median"]) / (n2 - n1), n1, n2)


def fmt(value):
    if value is None:
        return "n/a"
    if abs(value) >= 100 or float(value).is_integer():
        return "%.0f" % value
    return "%.2f" % value if abs(value) >= 0.1 else "%.2g" % value


def pair(record, key):
    a, b = record.get(key + "_median"), record.get(key + "_max")
    return "n/a" if a is None else "%s / %s" % (fmt(a), fmt(b))


def scale_table(scale):
    rows = ["| variant | N | launch to all up s | init s med / max | "
            "cold round s med / max | warm round s med / max | fds med / max "
            "| VmHWM MB med / max | libraries once up | load | status |",
            "|" + "---|" * 11]
    for label, per_n in scale["variants"].items():
        for n, r in sorted(per_n.items(), key=lambda kv: int(kv[0])):
            status = r["status"]
            rows.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f "
                        "| %s |"
                        % (label, n, fmt(r.get("launch_to_all_up_s")),
                           pair(r, "init_s"), pair(r, "cold_round_s"),
                           pair(r, "warm_round_s"), pair(r, "fds"),
                           pair(r, "vmhwm_MB"),
                           fmt(r.get("shared_libraries_up_median")),
                           r["loadavg_at_start"],
                           status if len(status) < 200 else
                           status[:197] + "..."))
    bare = ["| N | launch to all at main s | wall to all exited s | CPU s at "
            "main med / max | shared libraries | RSS at main MB | load |",
            "|" + "---|" * 7]
    for n, r in sorted(scale["bare"].items(), key=lambda kv: int(kv[0])):
        bare.append("| %s | %s | %s | %s | %s | %s | %.0f |" % (
            n, fmt(r.get("launch_to_all_main_s")), fmt(r["wall_s"]),
            pair(r, "cpu_s_at_main"), fmt(r.get("shared_libraries_median")),
            fmt(r.get("rss_at_main_MB_median")), r["loadavg_at_start"]))
    grow = ["| variant | fds per peer | VmHWM MB per peer | between N |",
            "|---|---|---|---|"]
    for label, per_n in scale["variants"].items():
        g = growth(per_n)
        grow.append("| %s | %s | %s | %s |" % (
            (label,) + (("n/a",) * 3 if g is None else
                        ("%.2f" % g[0], "%.2f" % g[1],
                         "%d and %d" % (g[2], g[3])))))
    return "\n".join(
        ["### Per backend variant and world size N (medians and maxima over "
         "the ranks)", ""] + rows +
        ["", "### Growth per peer (slope of the medians)", ""] + grow +
        ["", "### Bare process start (scale_worker --bare: load the libraries, "
         "exit)", ""] + bare)


# ---- the plot ----

def plot_scale(scale, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), dpi=80)
    panels = [
        (axes[0][0], "launch_to_all_up_s", "launch to all up (s)"),
        (axes[0][1], "warm_round_s_max", "warm all-to-all round, slowest "
         "rank (s)"),
        (axes[1][0], "fds_median", "open fds per worker (median)"),
        (axes[1][1], "vmhwm_MB_median", "VmHWM per worker, MB (median)"),
    ]
    for ax, key, title in panels:
        for label, per_n in scale["variants"].items():
            points = sorted((int(n), r[key]) for n, r in per_n.items()
                            if r["status"] == "ok" and key in r)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points],
                        marker="o", markersize=3, label=label)
        if key == "launch_to_all_up_s":
            points = sorted((int(n), r["launch_to_all_main_s"])
                            for n, r in scale["bare"].items()
                            if "launch_to_all_main_s" in r)
            ax.plot([p[0] for p in points], [p[1] for p in points], "k--",
                    marker="x", markersize=4, label="bare process start")
            ax.axhline(10, color="grey", linestyle=":", label="target 10 s")
        if key == "warm_round_s_max":
            ax.axhline(1, color="grey", linestyle=":", label="target 1 s")
        ax.set_xscale("log", base=2)
        if key.endswith("_s") or key.endswith("_s_max"):
            ax.set_yscale("log")  # seconds over decades
        ax.set_xticks(scale["sizes"])
        ax.set_xticklabels([str(n) for n in scale["sizes"]])
        ax.set_xlabel("world size (processes on this machine)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle("scale: N workers on one %s-CPU machine"
                 % scale.get("cpus", "?"),
                 fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, "scale.png")
    fig.savefig(path)
    plt.close(fig)
    return [path]
