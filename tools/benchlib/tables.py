"""The Markdown report of a run (stdout and DIR/table.md)."""
from .formatting import fmt, human_bytes, markdown, verdict
from .results import ok, ratio
from .scale import scale_table
from .variants import (LIMIT_BANDWIDTH_MIN, LIMIT_LATENCY_MAX, LOCAL_STEP,
                       PEER_PAIRS, PEERS, VARIANTS, WORKLOADS)


def workload_table(results):
    variants = [l for l, *_ in VARIANTS if ok(results["variants"].get(l))]
    peers = [l for l, *_ in PEERS if ok(results["peers"].get(l))]
    pairs = [(t, p) for t, p in PEER_PAIRS if t in variants and p in peers]
    header = ["workload"] + variants + peers + [
        "%s / %s" % (t.replace("tensorpipe ", "tp "), p) for t, p in pairs]
    rows = []
    for key, label, unit, _ in WORKLOADS + [
            (LOCAL_STEP, "(its compute alone, no RPC)", "us", "lower")]:
        row = ["%s (%s)" % (label, unit)]
        row += [fmt(results["variants"][v].get(key), unit) for v in variants]
        row += [fmt(results["peers"][p].get(key), unit) for p in peers]
        for t, p in pairs:
            r = ratio(results["variants"][t].get(key),
                      results["peers"][p].get(key))
            row.append("n/a" if r is None else "%.3g" % r)
        rows.append(row)
    return markdown(header, rows)


def limit_table(rows):
    header = ["variant", "rpc_sync p50 us", "raw baseline", "ratio (<= %.1f)"
              % LIMIT_LATENCY_MAX, "", "echo GB/s", "raw baseline",
              "ratio (>= %.1f)" % LIMIT_BANDWIDTH_MIN, ""]
    out = []
    for r in rows:
        out.append([
            r["variant"], fmt(r["latency_us"], "us"),
            "%s %s" % (r["latency_baseline"],
                       fmt(r["latency_baseline_us"], "us")),
            fmt(r["latency_ratio"]), verdict(r["latency_met"]),
            "%s (%s)" % (fmt(r["bandwidth_GBps"]),
                         human_bytes(r["bandwidth_bytes"])),
            "%s %s" % (r["bandwidth_baseline"],
                       fmt(r["bandwidth_baseline_GBps"])),
            fmt(r["bandwidth_ratio"]), verdict(r["bandwidth_met"])])
    return markdown(header, out)


def peer_table(rows):
    units = dict((k, u) for k, _, u, _ in WORKLOADS)
    labels = dict((k, l) for k, l, _, _ in WORKLOADS)
    out = []
    for r in rows:
        u = units[r["key"]]
        out.append(["%s vs %s" % (r["tether"], r["peer"]), labels[r["key"]],
                    fmt(r["tether_value"], u), fmt(r["peer_value"], u),
                    "n/a" if r["gain"] is None else "%.2fx" % r["gain"],
                    ">= %gx" % r["target"], verdict(r["met"]),
                    r.get("note", "")])
    return markdown(["pair", "workload", "tether", "peer", "better by",
                     "target", "", "note"], out)


def baseline_table(results):
    out = []
    for label, b in results["baselines"].items():
        if b["status"] != "ok":
            out.append([label, "n/a", "n/a", b["status"]])
            continue
        bw = fmt(b["bw_GBps"])
        if b.get("bw_bytes"):
            bw += " (%s)" % human_bytes(b["bw_bytes"])
        out.append([label, fmt(b["small_p50_us"], "us"), bw, b["note"]])
    return markdown(["raw baseline", "p50 us (round trip; step)", "GB/s",
                     "note"], out)


def not_available(results):
    lines = []
    for group in ("variants", "peers"):
        for label, r in results[group].items():
            if not ok(r):
                lines.append("- %s: %s" % (label, r.get("status")))
    return "\n".join(lines)


def report(results):
    if results.get("variants") is None:
        return scale_report(results["scale"]) + "\n"
    host = results.get("host", {})
    parts = ["%s run%s, %s, %s CPUs, load average %s at start, %s at end, "
             "%.0f s." % ("quick" if results["quick"] else "full",
                          " (medians of %d rounds)" % results["repeat"]
                          if results.get("repeat", 1) > 1 else "",
                          results.get("date", "?"), host.get("cpus", "?"),
                          fmt(host.get("loadavg_at_start")),
                          fmt(host.get("loadavg_at_end")),
                          results.get("seconds", 0)), "",
             "## Workloads (two processes, rank 0 -> rank 1%s)"
             % (", on two simulated hosts"
                if results.get("placement") == "two simulated hosts" else ""),
             "",
             workload_table(results), "",
             "## Against each backend's own raw baseline", "",
             limit_table(results["limits"]), "",
             "## Against the peer (the bench's targets)", "",
             peer_table(results["peer_targets"]), "",
             "## Raw baselines", "", baseline_table(results)]
    missing = not_available(results)
    if missing:
        parts += ["", "## Not measured", "", missing]
    if results.get("scale"):
        parts += ["", scale_report(results["scale"])]
    return "\n".join(parts) + "\n"


def scale_report(scale):
    return "\n".join([
        "## Scale: `%s`, %s, load average %s at start, %s at end, "
        "%.0f s" % (scale["command"], scale["date"],
                    fmt(scale["loadavg_at_start"]),
                    fmt(scale["loadavg_at_end"]), scale["seconds"]), "",
        scale_table(scale)])
