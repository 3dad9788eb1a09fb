"""From the runs' records to the results: medians over repeated rounds,
each variant against its own raw baseline (limit_rows) and the like-for-like
pairs against the peer (peer_rows)."""
from statistics import median

from .formatting import fmt
from .variants import (BASELINE_OF, BIG, LIMIT_BANDWIDTH_MIN,
                       LIMIT_LATENCY_MAX, LOCAL_STEP, PEER_PAIRS,
                       PEER_TARGETS, VARIANTS, WORKLOADS)


def merge_runs(records):
    """One record from the same run repeated: each number the median over
    the repeats that succeeded (sweep rows by size); the first failure's
    status if none did."""
    good = [r for r in records if r.get("status") == "ok"]
    if not good:
        return records[0]
    merged = dict(good[0])
    for key, value in good[0].items():
        values = [r.get(key) for r in good]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool)
               for v in values):
            merged[key] = median(values)
    if good[0].get("sweep"):
        rows = []
        for row in good[0]["sweep"]:
            same = [x for r in good for x in r.get("sweep", [])
                    if x["bytes"] == row["bytes"]]
            rows.append(merge_runs([dict(x, status="ok") for x in same]))
            rows[-1].pop("status")
        merged["sweep"] = rows
    if len(records) > 1:
        merged["repeats_ok"] = "%d of %d" % (len(good), len(records))
    return merged


def ok(result):
    return result is not None and result.get("status") == "ok"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def gain(key, tether, peer):
    """How many times better tether is than the peer on `key`."""
    better = dict((k, b) for k, _, _, b in WORKLOADS)[key]
    if tether is None or peer is None:
        return None
    return ratio(peer, tether) if better == "lower" else ratio(tether, peer)


def limit_rows(results):
    """Each variant against its own raw baseline. Across hosts
    (results["placement"], bench --hosts) nothing copies through memory:
    a variant bounded by a memcpy on one host is bounded by raw TCP."""
    rows = []
    across_hosts = results.get("placement") == "two simulated hosts"
    for label, *_ in VARIANTS:
        v = results["variants"].get(label)
        if not ok(v):
            continue
        lat_base, bw_base = BASELINE_OF[label]
        if across_hosts and bw_base.startswith("memcpy"):
            bw_base = "raw TCP"
        lb = results["baselines"].get(lat_base, {})
        bb = results["baselines"].get(bw_base, {})
        lat = ratio(v.get("builtin_rpc_sync_p50_us"), lb.get("small_p50_us"))
        # At the baseline's largest size when it stops short of 64 MiB.
        bw_bytes = bb.get("bw_bytes") or BIG
        at_size = [r["GBps"] for r in v.get("sweep", [])
                   if r["bytes"] == bw_bytes]
        bw_value = at_size[0] if at_size else v.get("echo_64MB_GBps")
        bw = ratio(bw_value, bb.get("bw_GBps"))
        rows.append({
            "variant": label,
            "latency_us": v.get("builtin_rpc_sync_p50_us"),
            "latency_baseline": lat_base,
            "latency_baseline_us": lb.get("small_p50_us"),
            "latency_ratio": lat,
            "latency_met": None if lat is None else lat <= LIMIT_LATENCY_MAX,
            "bandwidth_bytes": bw_bytes if at_size else BIG,
            "bandwidth_GBps": bw_value,
            "bandwidth_baseline": bw_base,
            "bandwidth_baseline_GBps": bb.get("bw_GBps"),
            "bandwidth_ratio": bw,
            "bandwidth_met": None if bw is None else bw >= LIMIT_BANDWIDTH_MIN,
        })
    return rows


def peer_rows(results):
    rows = []
    for t, p in PEER_PAIRS:
        tv, pv = results["variants"].get(t), results["peers"].get(p)
        for key, factor in PEER_TARGETS:
            g = gain(key, tv.get(key) if ok(tv) else None,
                     pv.get(key) if ok(pv) else None)
            rows.append({"tether": t, "peer": p, "key": key,
                         "tether_value": tv.get(key) if ok(tv) else None,
                         "peer_value": pv.get(key) if ok(pv) else None,
                         "gain": g, "target": factor,
                         "met": None if g is None else g >= factor,
                         "note": peer_note(key, tv, pv)})
    return rows


def peer_note(key, tether, peer):
    """What bounds a gain whatever tether does: the step's own compute,
    measured in tether's rank 0 alternating with its steps."""
    if key != "dist_autograd_step_p50_us" or not ok(tether) or not ok(peer):
        return ""
    floor = tether.get(LOCAL_STEP)
    if not floor:
        return ""
    return "compute alone %s us: at most %.1fx possible" % (
        fmt(floor, "us"), peer[key] / floor)
