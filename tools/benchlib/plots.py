"""The plots of a run: DIR/latency_vs_size.png, DIR/bandwidth_vs_size.png,
DIR/cpu.png and, with a scale section, DIR/scale.png (matplotlib: here, or
under --python when this interpreter has none)."""
import json
import os

from .processes import TOOLS_DIR, run, tail
from .results import ok
from .scale import plot_scale
from .variants import CPU_KEYS, WORKLOADS


def plot(results, out_dir):
    paths = []
    if results.get("scale"):
        paths += plot_scale(results["scale"], out_dir)
    if results.get("variants") is not None:
        paths += plot_sweeps(results, out_dir)
        paths += plot_cpu(results, out_dir)
    return paths


def plot_cpu(results, out_dir):
    """cpu.png: CPU per call and idle CPU, per variant and peer."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("tether " + label, r) for label, r in results["variants"].items()
            if ok(r) and r.get(CPU_KEYS[0]) is not None]
    rows += [("torch.distributed.rpc " + label[5:].strip(), r)
             for label, r in results["peers"].items()
             if ok(r) and r.get(CPU_KEYS[0]) is not None]
    if not rows:
        return []
    labels = dict((k, l) for k, l, _, _ in WORKLOADS)
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.5 + 0.35 * len(rows)),
                             dpi=80, sharey=True)
    for ax, keys, xlabel in (
            (axes[0], CPU_KEYS[:2], "CPU per call, both processes (us)"),
            (axes[1], CPU_KEYS[2:], "idle CPU per process (% of a core)")):
        height = 0.8 / len(keys)
        for i, key in enumerate(keys):
            ax.barh([n + i * height for n in range(len(rows))],
                    [r.get(key) or 0 for _, r in rows], height=height,
                    label=labels[key])
        ax.set_xlabel(xlabel)
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_yticks([n + 0.4 - 0.2 for n in range(len(rows))])
    axes[0].set_yticklabels([name for name, _ in rows], fontsize=7)
    axes[0].invert_yaxis()
    fig.tight_layout()
    path = os.path.join(out_dir, "cpu.png")
    fig.savefig(path)
    plt.close(fig)
    return [path]


def plot_sweeps(results, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = []
    for group in ("variants", "peers"):
        for label, r in results[group].items():
            if ok(r) and r.get("sweep"):
                name = ("torch.distributed.rpc " + label[5:].strip()
                        if group == "peers" else "tether " + label)
                series.append((name.strip(), r["sweep"], "-"))
    for label, b in results["baselines"].items():
        if b["status"] == "ok" and b["sweep"]:
            series.append((label, b["sweep"], "--"))
    paths = []
    for name, key, ylabel in (
            ("latency_vs_size.png", "p50_us", "round trip p50 (us)"),
            ("bandwidth_vs_size.png", "GBps", "GB/s (both ways)")):
        fig, ax = plt.subplots(figsize=(8, 5), dpi=80)
        for label, sweep, style in series:
            ax.plot([r["bytes"] for r in sweep], [r[key] for r in sweep],
                    style, marker="o", markersize=3, label=label)
        for label, style in (("memcpy", ":"), ("memcpy, fresh buffer", "-."),
                             ("memcpy, huge pages", "--")):
            copy = results["baselines"].get(label, {})
            if key == "GBps" and copy.get("status") == "ok":
                ax.axhline(copy["bw_GBps"], color="grey", linestyle=style,
                           label="%s, 64 MiB (one thread)" % label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("payload (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title("echo of a tensor between two processes (%s%s)"
                     % ("quick" if results["quick"] else "full",
                        ", medians of %d rounds" % results["repeat"]
                        if results.get("repeat", 1) > 1 else ""))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_anywhere(args, results_path, out_dir, log):
    """Plots here if matplotlib imports, else under --python."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if not os.path.exists(args.python):
            log("plots: no matplotlib (scripts/bench_setup.sh installs "
                "python3-matplotlib)")
            return
        code, out, err = run([args.python,
                              os.path.join(TOOLS_DIR, "bench.py"),
                              "--plot_only", results_path, "--out", out_dir],
                             300)
        log(out.strip() if code == 0 else "plots failed: " + tail(err))
        return
    with open(results_path) as f:
        results = json.load(f)
    for path in plot(results, out_dir):
        log("wrote " + path)
