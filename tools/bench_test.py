"""Tests of the bench CLI (tools/bench.py, tools/benchlib): parsing the
tools' output, the tables and targets from results (including variants that
are not available), and one end-to-end smoke run on TensorPipe with a handful of
calls (no timing is asserted)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from tools.benchlib import baselines, cli, hosts, processes, tables
from tools.benchlib import scale as bench_scale
from tools.benchlib import variants
from tools.benchlib.results import limit_rows, merge_runs, peer_rows


def variant(sync_p50, gbps_64, status="ok"):
    return {"status": status, "builtin_rpc_sync_p50_us": sync_p50,
            "builtin_rpc_sync_p99_us": sync_p50 * 2,
            "builtin_rpc_async_calls_per_s": 1e6 / sync_p50,
            "remote_to_here_p50_us": sync_p50 * 2, "echo_1MB_GBps": 1.0,
            "echo_64MB_GBps": gbps_64, "dist_autograd_step_p50_us": 1000.0,
            "sweep": [{"bytes": 8, "p50_us": sync_p50, "GBps": 1e-4},
                      {"bytes": 64 << 20, "p50_us": 1e5, "GBps": gbps_64}]}


def fake_results():
    results = {"quick": True,
               "variants": {"tensorpipe uv": variant(20.0, 1.0),
                            "tensorpipe negotiated": variant(10.0, 2.0),
                            "grpc": {"status": "n/a: not registered"}},
               "peers": {"peer": variant(200.0, 1.0),
                         "peer uv": {"status": "n/a: no torch"}},
               "baselines": {
                   "raw TCP": baselines.raw_record(
                       "raw TCP", small_p50_us=10.0, bw_GBps=1.0,
                       bw_bytes=64 << 20),
                   "memcpy": baselines.raw_record("memcpy", bw_GBps=4.0),
                   "bare gRPC": baselines.raw_record("bare gRPC",
                                                     "n/a: not built")}}
    results["limits"] = limit_rows(results)
    results["peer_targets"] = peer_rows(results)
    return results


class ParseTest(unittest.TestCase):

    def test_json_line_of_rank_0_under_the_launcher(self):
        text = '[1] noise\n[0] bench_worker: rpc_sync done\n[0] JSON {"a": 1}\n'
        self.assertEqual(processes.parse_json_line(text), {"a": 1})
        self.assertIsNone(processes.parse_json_line("[0] no json here\n"))

    def test_baseline_record_from_a_sweep(self):
        rows = [{"bytes": 8, "p50_us": 40.0, "GBps": 0.0},
                {"bytes": 1 << 20, "p50_us": 500.0, "GBps": 4.2},
                {"bytes": 128 << 20, "p50_us": 9e4, "GBps": 3.0}]
        record = baselines.from_sweep("bare gRPC", rows)
        self.assertEqual(record["small_p50_us"], 40.0)
        self.assertAlmostEqual(record["bw_GBps"], 4.2)
        self.assertEqual(record["bw_bytes"], 1 << 20)


class RepeatTest(unittest.TestCase):

    def test_medians_over_the_rounds_that_succeeded(self):
        merged = merge_runs([variant(10.0, 1.0), variant(30.0, 3.0),
                                   {"status": "failed: boom"},
                                   variant(20.0, 2.0)])
        self.assertEqual(merged["status"], "ok")
        self.assertEqual(merged["builtin_rpc_sync_p50_us"], 20.0)
        self.assertEqual(merged["sweep"][1]["GBps"], 2.0)
        self.assertEqual(merged["repeats_ok"], "3 of 4")
        failed = merge_runs([{"status": "n/a: x"}, {"status": "n/a: x"}])
        self.assertEqual(failed["status"], "n/a: x")


class TablesTest(unittest.TestCase):

    def test_targets_against_own_baseline(self):
        limits = {r["variant"]: r for r in fake_results()["limits"]}
        self.assertEqual(set(limits), {"tensorpipe uv", "tensorpipe negotiated"})
        uv = limits["tensorpipe uv"]
        self.assertAlmostEqual(uv["latency_ratio"], 2.0)
        self.assertFalse(uv["latency_met"])
        self.assertTrue(uv["bandwidth_met"])  # 1.0 / 1.0 raw TCP
        negotiated = limits["tensorpipe negotiated"]
        self.assertTrue(negotiated["latency_met"])
        self.assertAlmostEqual(negotiated["bandwidth_ratio"], 0.5)  # memcpy
        self.assertFalse(negotiated["bandwidth_met"])

    def test_targets_against_peer(self):
        rows = fake_results()["peer_targets"]
        by_key = {(r["tether"], r["key"]): r for r in rows}
        sync = by_key[("tensorpipe negotiated", "builtin_rpc_sync_p50_us")]
        self.assertAlmostEqual(sync["gain"], 20.0)  # times: peer / tether
        self.assertTrue(sync["met"])
        rate = by_key[("tensorpipe negotiated", "builtin_rpc_async_calls_per_s")]
        self.assertAlmostEqual(rate["gain"], 20.0)  # rates: tether / peer
        big = by_key[("tensorpipe negotiated", "echo_64MB_GBps")]
        self.assertAlmostEqual(big["gain"], 2.0)
        self.assertTrue(big["met"])
        # The uv pair has no peer: not measured, neither met nor missed.
        uv = by_key[("tensorpipe uv", "builtin_rpc_sync_p50_us")]
        self.assertIsNone(uv["gain"])
        self.assertIsNone(uv["met"])

    def test_report_lists_what_was_not_measured(self):
        text = tables.report(fake_results())
        self.assertIn("| rpc_sync p50 (us) | 20.0 | 10.0 | 200.0 | 0.05 |",
                      text)
        self.assertIn("- grpc: n/a: not registered", text)
        self.assertIn("- peer uv: n/a: no torch", text)
        self.assertIn("| bare gRPC | n/a | n/a | n/a: not built |", text)


def rank_line(rank, n, status="ok", **numbers):
    record = {"variant": "grpc", "rank": rank, "world_size": n,
              "main_unix": 1000.5 + rank, "up_unix": 1001.0 + rank,
              "init_s": 0.5, "cold_round_s": 0.2 + rank, "warm_round_s": 0.01,
              "fds": 10 + rank, "vmhwm_kb": 1024 * (100 + rank),
              "status": status}
    record.update(numbers)
    return "[%d] JSON %s" % (rank, json.dumps(record))


class ScaleTest(unittest.TestCase):

    def test_world_summary_over_the_ranks(self):
        out = "\n".join([rank_line(1, 2), "[0] noise", rank_line(0, 2)])
        r = bench_scale.summarize(2, bench_scale.rank_lines(out), 1000.0, 3.0,
                                  0, out, "", processes.tail)
        self.assertEqual(r["status"], "ok")
        self.assertEqual(r["ranks_reported"], 2)
        self.assertAlmostEqual(r["launch_to_all_up_s"], 2.0)
        self.assertAlmostEqual(r["launch_to_all_main_s"], 1.5)
        self.assertAlmostEqual(r["cold_round_s_median"], 0.7)
        self.assertAlmostEqual(r["cold_round_s_max"], 1.2)
        self.assertAlmostEqual(r["vmhwm_MB_max"], 101.0)

    def test_failure_names_the_rank_and_the_missing(self):
        out = "\n".join([
            rank_line(0, 3, status="failed: UNAVAILABLE: cold round: w0 -> w2: "
                      "lost the connection"),
            rank_line(1, 3)])
        r = bench_scale.summarize(3, bench_scale.rank_lines(out), 1000.0, 9.0,
                                  1, out, "", processes.tail)
        self.assertIn("tether_run exit 1", r["status"])
        self.assertIn("2 of 3 ranks reported", r["status"])
        self.assertIn("rank 0: failed: UNAVAILABLE: cold round: w0 -> w2",
                      r["status"])
        self.assertNotIn("launch_to_all_up_s", r)
        timed_out = bench_scale.summarize(2, {}, 1000.0, 900.0, None,
                                          "[1] E0101 init failed: refused", "",
                                          processes.tail)
        self.assertIn("timed out after 900 s", timed_out["status"])
        self.assertIn("[1] E0101 init failed: refused", timed_out["status"])

    def test_growth_per_peer_and_table(self):
        def world(fds, mb, status="ok"):
            return {"status": status, "loadavg_at_start": 1.0,
                    "fds_median": fds, "fds_max": fds, "vmhwm_MB_median": mb,
                    "vmhwm_MB_max": mb, "wall_s": 1.0}
        scale = {"sizes": [2, 4, 8], "bare": {},
                 "variants": {"grpc": {"2": world(10, 100), "4": world(14, 102),
                                       "8": world(0, 0, "failed: x")}}}
        self.assertEqual(bench_scale.growth(scale["variants"]["grpc"]),
                         (2.0, 1.0, 2, 4))
        text = bench_scale.scale_table(scale)
        self.assertIn("| grpc | 2.00 | 1.00 | 2 and 4 |", text)
        self.assertIn("| grpc | 8 | n/a |", text)
        self.assertIn("failed: x |", text)

    def test_variants_by_label_or_backend(self):
        self.assertEqual(bench_scale.pick_variants(variants.VARIANTS, None),
                         bench_scale.SCALE_DEFAULT)
        self.assertEqual(
            bench_scale.pick_variants(variants.VARIANTS,
                                      ["libfabric", "tensorpipe uv"]),
            ["libfabric tcp;ofi_rxm", "libfabric shm", "tensorpipe uv"])
        with self.assertRaises(ValueError):
            bench_scale.pick_variants(variants.VARIANTS, ["nccl"])
        self.assertEqual(bench_scale.parse_sizes("64,2,4,2"), [2, 4, 64])
        with self.assertRaises(ValueError):
            bench_scale.parse_sizes("1,4")

    def test_recorded_paths_are_relative_to_the_repository(self):
        root = "/srv/checkout"
        self.assertEqual(cli.relative_to_workspace(
            "--out=/srv/checkout/docs/bench", root), "--out=docs/bench")
        self.assertEqual(cli.relative_to_workspace(
            "/srv/checkout/docs/bench", root), "docs/bench")
        self.assertEqual(cli.relative_to_workspace("--out=/tmp/x/run1", root),
                         "--out=.../run1")
        self.assertEqual(cli.relative_to_workspace("--only=grpc", root),
                         "--only=grpc")


BENCH = os.path.join(os.path.dirname(__file__), "bench.py")
PEER_BENCH = os.path.join(os.path.dirname(__file__), "peer_bench.py")


class HostsTest(unittest.TestCase):
    """--hosts: its arguments, and what it changes without namespaces."""

    def test_hosts_is_refused_with_scale(self):
        run = subprocess.run([sys.executable, BENCH, "--hosts", "--scale", "2"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 2)
        self.assertIn("--hosts runs the two-process workloads", run.stderr)

    def test_launcher_places_two_ranks_and_ends_them_first(self):
        command = hosts.launcher("/x/on_hosts.sh", 120)
        self.assertEqual(command, ["/x/on_hosts.sh", "--timeout", "110", "2",
                                   "--"])
        self.assertEqual(hosts.launcher("/x/on_hosts.sh", 5)[2], "1")
        self.assertTrue(os.access(hosts.launcher_script(), os.X_OK))

    def test_across_hosts_the_bandwidth_bound_is_raw_tcp(self):
        results = fake_results()
        results["placement"] = "two simulated hosts"
        limits = {r["variant"]: r for r in limit_rows(results)}
        negotiated = limits["tensorpipe negotiated"]
        self.assertEqual(negotiated["bandwidth_baseline"], "raw TCP")
        self.assertAlmostEqual(negotiated["bandwidth_ratio"], 2.0)  # 2 / 1
        self.assertEqual(limits["tensorpipe uv"]["bandwidth_baseline"],
                         "raw TCP")

    def test_loopback_pins_move_to_the_host_interface(self):
        self.assertEqual(
            hosts.placed_env({"FI_TCP_IFACE": "lo", "THP_MEM_ALLOC_ENABLE": "1"}),
            {"FI_TCP_IFACE": "eth0", "THP_MEM_ALLOC_ENABLE": "1"})
        self.assertEqual(hosts.placed_env({"FI_TCP_IFACE": "ib0"}),
                         {"FI_TCP_IFACE": "ib0"})


    def test_launched_peer_needs_the_launcher_variables(self):
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "MASTER_ADDR", "MASTER_PORT")}
        run = subprocess.run([sys.executable, PEER_BENCH, "--launched"],
                             capture_output=True, text=True, timeout=60,
                             env=env)
        self.assertEqual(run.returncode, 2)
        self.assertIn("--launched needs RANK, MASTER_ADDR and MASTER_PORT",
                      run.stderr)


class HostsSmokeTest(unittest.TestCase):
    """One variant across two simulated hosts (needs root and namespaces:
    //tools:bench_hosts_test, exclusive; skipped where they cannot be made,
    as the bench says)."""

    def test_one_variant_across_hosts(self):
        out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        run = subprocess.run(
            [sys.executable, BENCH, "--hosts", "--smoke", "--quick",
             "--only", "tensorpipe negotiated", "--no_peer", "--no_plots",
             "--max_bytes=4096", "--out", out],
            capture_output=True, text=True, timeout=240)
        if run.returncode == 2 and "no simulated hosts here" in run.stderr:
            self.skipTest(run.stderr.strip().splitlines()[-1])
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)
        self.assertEqual(results["placement"], "two simulated hosts")
        negotiated = results["variants"]["tensorpipe negotiated"]
        self.assertEqual(negotiated["status"], "ok", negotiated)
        self.assertGreater(negotiated["builtin_rpc_sync_p50_us"], 0)
        # Raw TCP and TensorPipe's pipe alone between the hosts too; the
        # external baselines, on 127.0.0.1 only, are not measured there.
        self.assertEqual(results["baselines"]["raw TCP"]["status"], "ok")
        self.assertIn("between the hosts",
                      results["baselines"]["raw TCP"]["note"])
        self.assertEqual(
            results["baselines"]["TensorPipe pipe alone"]["status"], "ok")
        self.assertEqual(results["baselines"]["bare gRPC"]["status"],
                         hosts.BASELINES_NOT_ACROSS)
        self.assertIn("on two simulated hosts", run.stdout)


class SmokeTest(unittest.TestCase):

    def test_scale_end_to_end(self):
        out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        run = subprocess.run(
            [sys.executable, os.path.join(os.path.dirname(__file__), "bench.py"),
             "--scale", "2", "--backends", "tensorpipe negotiated",
             "--no_plots", "--scale_timeout", "200", "--out", out],
            capture_output=True, text=True, timeout=240)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(out, "results.json")) as f:
            text = f.read()
        scale = json.loads(text)["scale"]
        world = scale["variants"]["tensorpipe negotiated"]["2"]
        self.assertEqual(world["status"], "ok", world)
        for key in ("launch_to_all_up_s", "init_s_max", "cold_round_s_max",
                    "warm_round_s_max", "fds_median", "vmhwm_MB_median"):
            self.assertIn(key, world)
        self.assertEqual(scale["bare"]["2"]["status"], "ok")
        self.assertNotIn(out, text)
        self.assertIn("## Scale", run.stdout)

    def test_one_variant_end_to_end(self):
        out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        run = subprocess.run(
            [sys.executable, os.path.join(os.path.dirname(__file__), "bench.py"),
             "--smoke", "--quick", "--only", "tensorpipe negotiated",
             "--only", "tensorpipe negotiated, huge pages",
             "--only", "libfabric shm", "--no_peer", "--no_plots",
             "--max_bytes=4096", "--out", out],
            capture_output=True, text=True, timeout=240)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)
        negotiated = results["variants"]["tensorpipe negotiated"]
        self.assertEqual(negotiated["status"], "ok", negotiated)
        for key, *_ in variants.WORKLOADS:
            self.assertIn(key, negotiated)
        # Every call costs some CPU in the two processes; idle, a share of
        # a core between none and all of it.
        for key in variants.CPU_KEYS[:2]:
            self.assertGreater(negotiated[key], 0, key)
        for key in variants.CPU_KEYS[2:]:
            self.assertTrue(0 <= negotiated[key] <= 100, (key, negotiated))
        self.assertEqual([r["bytes"] for r in negotiated["sweep"]],
                         [8, 64, 256, 1024, 4096])
        # Not registered in this build, or registered: either way reported.
        self.assertIn("status", results["variants"]["libfabric shm"])
        self.assertEqual(results["baselines"]["raw TCP"]["status"], "ok")
        pipe = results["baselines"]["TensorPipe pipe alone"]
        self.assertEqual(pipe["status"], "ok")
        self.assertGreater(pipe["small_p50_us"], 0)
        # The huge-page variant's environment reaches its workers, and only
        # theirs; its baseline is memcpy between buffers on huge pages.
        huge = results["variants"]["tensorpipe negotiated, huge pages"]
        self.assertEqual(huge["status"], "ok", huge)
        self.assertIs(huge["huge_pages"], True)
        self.assertIs(negotiated["huge_pages"], False)
        copy = results["baselines"]["memcpy, huge pages"]
        self.assertEqual(copy["status"], "ok")
        self.assertGreater(copy["bw_GBps"], 0)
        self.assertIn("## Workloads", run.stdout)


if __name__ == "__main__":
    unittest.main()
