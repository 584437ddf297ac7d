"""The pure parts of bench/bench.py (the benchmark harness), on the CPU: grids, FLOP and byte
counting, rows, tables, output names, and the driver's recovery from a worker that dies."""

import json
import math
import os
import sys
import textwrap

import pytest

BENCH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH_DIR)
import bench  # noqa: E402
from bench import Point  # noqa: E402


def prefill(s=4096, d=128, mask="none"):
    return Point("prefill", "bf16", 16384 // s, 2048 // d, 2048 // d, s, s, d, mask)


def test_forward_flops_are_4_b_h_sq_skv_d():
    assert bench.flops(prefill()) == 4 * 4 * 16 * 4096 * 4096 * 128


def test_causal_square_flops_are_halved():
    assert bench.flops(prefill(mask="causal")) == bench.flops(prefill()) / 2


def test_backward_and_forward_backward_multipliers():
    p = prefill()
    assert bench.flops(p, "bwd") == 2.5 * bench.flops(p)
    assert bench.flops(p, "fwd+bwd") == 3.5 * bench.flops(p)


def test_bottom_right_causal_counts_the_visible_pairs():
    # sq=4 against skv=8192: row i sees 8189 + i keys.
    assert bench.attended_pairs(4, 8192, True) == sum(8189 + i for i in range(4)) - 2
    assert bench.attended_pairs(4, 8192, True) == 4 * 8192 - 4 * 4 / 2


def test_varlen_flops_sum_over_sequences():
    p = Point("varlen", "bf16", 3, 16, 16, 300, 300, 64, "none", lens=(100, 200, 300))
    assert bench.flops(p) == 4 * 16 * 64 * (100**2 + 200**2 + 300**2)
    causal = Point("varlen", "bf16", 3, 16, 16, 300, 300, 64, "causal", lens=(100, 200, 300))
    assert bench.flops(causal) == bench.flops(p) / 2


def test_bytes_forward_backward_and_gqa():
    p = Point("decode", "bf16", 2, 8, 2, 4, 1024, 64, "causal_bottom_right")
    q = o = 2 * 4 * 8 * 64 * 2
    k = v = 2 * 1024 * 2 * 64 * 2
    lse = 2 * 4 * 8 * 4
    assert bench.bytes_moved(p, "fwd") == q + k + v + o + lse
    assert bench.bytes_moved(p, "bwd") == (q + k + v + o + lse) + o + q + k + v
    assert bench.bytes_moved(p, "fwd+bwd") == bench.bytes_moved(p) + bench.bytes_moved(p, "bwd")


def test_prefill_grid_is_16k_tokens_at_hidden_2048():
    points = bench.prefill_grid()
    assert len(points) == 2 * 3 * 6 * 2
    for p in points:
        assert p.batch * p.seqlen_q == 16384 and p.heads_q * p.head_dim == 2048
        assert p.directions == ("fwd", "bwd", "fwd+bwd")
    assert {p.seqlen_q for p in points} == {512, 1024, 2048, 4096, 8192, 16384}


def test_varlen_grid_has_uneven_lengths_and_dense_equivalents():
    points = bench.varlen_grid()
    varlen = [p for p in points if p.varlen]
    dense = [p for p in points if not p.varlen]
    assert len(varlen) == len(dense)
    for p in varlen:
        assert sum(p.lens) == 16384 and len(set(p.lens)) > 1 and min(p.lens) > 0
        assert any(d.batch == len(p.lens) and d.batch * d.seqlen_q == 16384 and
                   d.head_dim == p.head_dim and d.mask == p.mask for d in dense)


def test_small_seq_grid_matches_the_brief():
    points = bench.small_seq_grid()
    assert {(p.head_dim, p.seqlen_kv) for p in points} == {
        (d, s) for d in (128, 256, 512) for s in (2, 4, 8, 16)}
    for p in points:
        assert (p.seqlen_q, p.batch, p.heads_q, p.unit) == (1, 30720, 8, "tbps")
        assert "torch:math" in bench.implementations(p)
        assert p.directions == ("fwd", "bwd")


def test_decode_grid_is_bottom_right_with_sq_much_smaller_than_skv():
    for p in bench.decode_grid():
        assert p.seqlen_q * 32 <= p.seqlen_kv
        assert p.mask == ("none" if p.seqlen_q == 1 else "causal_bottom_right")


def test_quick_grids_are_small():
    for name, grid in bench.GRIDS.items():
        points = grid(quick=True)
        tasks = bench.make_tasks(points, quick=True)
        # varlen's two points with FlashAttention-4 among the peers: 49 tasks.
        assert 1 <= len(points) <= 2 and len(tasks) <= 50, name
    all_quick = [p for grid in bench.GRIDS.values() for p in grid(quick=True)]
    flex_points = {p.key for p in all_quick if "flex" in bench.implementations(p, quick=True)}
    assert len(flex_points) <= 3  # each costs a FlexAttention compile


def test_every_point_times_ours_and_flex():
    for grid in bench.GRIDS.values():
        for p in grid():
            impls = bench.implementations(p)
            assert impls[0] == bench.OURS and "flex" in impls


def test_point_round_trips_through_a_dict():
    p = Point("varlen", "bf16", 2, 4, 4, 9, 9, 64, "causal", lens=(4, 9))
    assert Point.from_dict(json.loads(json.dumps(p.to_dict()))) == p


DEVICE = {"name": "NVIDIA H100 80GB HBM3", "copy_tbps": 3.0, "gemm_tflops": 750.0,
          "date": "2026-11-23", "torch": "2.11.0", "torch_cudnn": 91900,
          "fusedattn_cudnn": 91900, "fusedattn": "0.1.0"}


def _results(**times):
    out = {}
    for impl, t in times.items():
        impl = impl.replace("_", ":", 1) if impl.startswith(("fusedattn_", "torch_")) else impl
        out[impl] = t if isinstance(t, dict) else {"status": "ok", "time_ms": t}
    return out


def test_analyze_rates_ratio_and_floor():
    p = prefill()
    results = _results(fusedattn_auto={"status": "ok", "time_ms": 2.0, "backend": "cudnn"},
                       torch_cudnn=2.5, torch_flash=4.0,
                       flex={"status": "failed", "error": "RuntimeError: boom"})
    row = bench.analyze(p, "fwd", results, DEVICE)
    f = bench.flops(p)
    assert row["impls"]["fusedattn:auto"]["tflops"] == pytest.approx(f / 2e-3 / 1e12)
    assert row["best_other"] == "torch:cudnn"
    assert row["ours_over_best"] == pytest.approx(2.5 / 2.0)
    floor_s = max(f / 750e12, bench.bytes_moved(p) / 3e12)
    assert row["ours_floor_fraction"] == pytest.approx(floor_s / 2e-3)
    assert row["bound"] == "compute" and row["impls"]["flex"]["status"] == "failed"


def test_small_seq_rows_are_memory_bound():
    p = bench.small_seq_grid()[0]
    row = bench.analyze(p, "fwd", _results(fusedattn_auto=1.0), DEVICE)
    assert row["bound"] == "memory"
    assert row["floor_ms"] == pytest.approx(bench.bytes_moved(p) / 3e12 * 1e3)


def test_analyze_without_ours_or_others_has_no_ratio():
    p = prefill()
    assert bench.analyze(p, "fwd", _results(torch_flash=1.0), DEVICE)["ours_over_best"] is None
    assert bench.analyze(p, "fwd", _results(fusedattn_auto=1.0), DEVICE)["ours_over_best"] is None


def test_markdown_table_shows_rates_statuses_and_ratios():
    p = prefill()
    results = _results(
        fusedattn_auto={"status": "ok", "time_ms": 2.0, "backend": "cudnn"},
        torch_cudnn=2.5,
        torch_flash={"status": "unsupported", "error": "head dim"},
        torch_efficient={"status": "failed", "error": "OutOfMemoryError: CUDA out of memory"},
        flex={"status": "crashed", "error": "worker exited with code -11"})
    rows = [bench.analyze(p, "fwd", results, DEVICE)]
    table = bench.markdown_table(rows, "tflops")
    header, rule, line = table.splitlines()[:3]
    assert header.split(" | ")[2:4] == ["fusedattn:auto", "torch:cudnn"]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == p.label and cells[1] == "fwd"
    assert cells[2] == "%s (cudnn)" % bench.three_digits(bench.flops(p) / 2e-3 / 1e12)
    assert cells[4:7] == ["n/a", "OOM", "crash"]
    assert cells[7] == "1.25"
    assert bench.failure_notes(rows)[0].startswith("- %s fwd torch:efficient" % p.label)


def test_markdown_table_in_tb_per_second():
    p = bench.small_seq_grid()[0]
    rows = [bench.analyze(p, "fwd", _results(fusedattn_auto=1.0), DEVICE)]
    table = bench.markdown_table(rows, "tbps")
    assert bench.three_digits(bench.bytes_moved(p) / 1e-3 / 1e12) in table and "TB/s" in table


def test_rates_show_three_significant_digits():
    assert [bench.three_digits(x) for x in (605.4, 60.54, 6.054, 0.6054)] == [
        "605", "60.5", "6.05", "0.605"]


def test_output_paths_name_grid_device_and_date(tmp_path):
    paths = bench.output_paths(str(tmp_path), "prefill", "NVIDIA H100 80GB HBM3", "2026-11-23")
    assert paths["md"] == str(tmp_path / "prefill-nvidia-h100-80gb-hbm3-2026-11-23.md")
    assert set(paths) == {"md", "json", "png"}


def test_write_markdown_and_json(tmp_path):
    points = [prefill(), prefill(mask="causal")]
    tasks = bench.make_tasks(points)
    results = {t["id"]: {"id": t["id"], "status": "ok", "time_ms": 1.0 + t["id"] % 3}
               for t in tasks}
    rows = bench.build_rows(points, tasks, results, DEVICE)
    assert len(rows) == 6
    small = bench.small_seq_grid(quick=True)
    small_tasks = bench.make_tasks(small)
    small_rows = bench.build_rows(small, small_tasks, {}, DEVICE)  # no results: all failed
    sections = [("prefill", rows, "tflops"), ("small_seq", small_rows, "tbps")]
    bench.write_markdown(str(tmp_path / "r.md"), sections, DEVICE)
    bench.write_json(str(tmp_path / "r.json"), sections, DEVICE, points + small, [])
    text = (tmp_path / "r.md").read_text()
    assert text.startswith("# fusedattn benchmark: prefill, small_seq on NVIDIA H100 80GB HBM3")
    assert "3.00 TB/s" in text and "## prefill" in text and "## small_seq" in text
    assert "no result" in text  # the failures are listed
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["device"]["name"] == DEVICE["name"] and len(data["rows"]) == 6 + 2
    assert data["rows"][0]["ours_over_best"] is not None


def test_write_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed here")
    points = [prefill()]
    tasks = bench.make_tasks(points)
    results = {t["id"]: {"id": t["id"], "status": "ok", "time_ms": 1.0} for t in tasks}
    rows = bench.build_rows(points, tasks, results, DEVICE)
    bench.write_plot(str(tmp_path / "r.png"), [("prefill", rows, "tflops")])
    assert (tmp_path / "r.png").stat().st_size > 1000


FAKE_WORKER = textwrap.dedent("""
    import json, os, sys
    job = json.load(open(sys.argv[1]))
    for task in job["tasks"]:
        print("BEGIN %d" % task["id"], flush=True)
        impl = task.get("impl")
        if impl == "segfault":
            print("dying", file=sys.stderr, flush=True)
            os._exit(139)
        if impl == "sticky":
            print("RESULT " + json.dumps({"id": task["id"], "status": "crashed",
                                          "error": "illegal memory access"}), flush=True)
            sys.exit(3)
        print("RESULT " + json.dumps({"id": task["id"], "status": "ok", "time_ms": 1.0}),
              flush=True)
""")


def test_driver_records_a_dying_worker_and_goes_on(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    tasks = [{"id": i, "kind": "measure", "impl": impl}
             for i, impl in enumerate(["a", "segfault", "b", "sticky", "c", "segfault", "d"])]
    log = []
    results = bench.run_tasks(tasks, lambda f: [sys.executable, str(script), f], {},
                              log=log.append)
    assert sorted(results) == list(range(7))
    for i in (0, 2, 4, 6):
        assert results[i]["status"] == "ok"
    for i in (1, 5):
        assert results[i]["status"] == "crashed"
        assert "code 139" in results[i]["error"] and "dying" in results[i]["error"]
    assert results[3]["status"] == "crashed" and "illegal" in results[3]["error"]


def test_driver_stops_when_the_worker_cannot_start(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import sys; print('ImportError: no torch', file=sys.stderr); sys.exit(1)")
    tasks = [{"id": i, "kind": "measure", "impl": "a"} for i in range(4)]
    results = bench.run_tasks(tasks, lambda f: [sys.executable, str(script), f], {},
                              log=lambda line: None)
    assert [results[i]["status"] for i in range(4)] == ["failed"] * 4
    assert "cannot start" in results[0]["error"] and "no torch" in results[0]["error"]


def test_driver_gives_up_after_too_many_restarts(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    tasks = [{"id": i, "kind": "measure", "impl": "segfault"} for i in range(5)]
    results = bench.run_tasks(tasks, lambda f: [sys.executable, str(script), f], {},
                              log=lambda line: None, max_restarts=2)
    assert [results[i]["status"] for i in range(5)] == ["crashed"] * 3 + ["failed"] * 2


def test_harness_imports_without_torch():
    import subprocess
    code = "import sys; sys.path.insert(0, %r); import bench; print('torch' in sys.modules)" % (
        BENCH_DIR)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# bench/ratio_table.py: the acceptance tables (one implementation's speed over another's).
import ratio_table  # noqa: E402


def _row(point, direction, **times):
    return {"point": point, "direction": direction,
            "impls": {impl.replace("_", ":"): ({"status": "ok", "time_ms": t} if t else
                                               {"status": "unsupported"})
                      for impl, t in times.items()}}


def test_ratio_is_the_reference_time_over_the_implementation_time():
    rows = [_row("p", "fwd", ours_x=2.0, torch_x=1.0)]
    assert ratio_table.ratios(rows, "ours:x", "torch:x") == [("p", "fwd", 0.5)]


def test_ratio_is_none_when_either_side_did_not_run():
    rows = [_row("p", "fwd", ours_x=2.0, torch_x=None)]
    assert ratio_table.ratios(rows, "ours:x", "torch:x") == [("p", "fwd", None)]


def test_table_marks_and_names_the_points_under_the_bound():
    rows = [_row("a", "fwd", ours_x=1.0, torch_x=1.0), _row("b", "bwd", ours_x=1.0, torch_x=0.9)]
    text = ratio_table.table(rows, [("ours:x", "torch:x")], bound=0.97)
    assert "| b | bwd | 0.900 **<** |" in text
    assert "| a | fwd | 1.000 |" in text
    assert "1 under 0.97: b bwd (0.900)" in text


def test_rounds_time_every_task_once_a_round_with_the_implementations_rotated():
    point = prefill()
    tasks = bench.make_tasks([point], rounds=2)
    impls = bench.implementations(point)
    measured = [t for t in tasks if t["kind"] == "measure"]
    assert len(measured) == 2 * len(impls) * len(point.directions)
    order = [[t["impl"] for t in measured if t["round"] == r and t["direction"] == "fwd"]
             for r in (0, 1)]
    assert order[0] == impls
    assert order[1] == impls[1:] + impls[:1]


def test_merged_rounds_keep_the_median_and_skip_failed_rounds():
    point = prefill()
    tasks = bench.make_tasks([point], rounds=3)
    same = [t for t in tasks if t["kind"] == "measure" and t["impl"] == "torch:cudnn"
            and t["direction"] == "fwd"]
    results = {t["id"]: {"id": t["id"], "status": "ok", "time_ms": 1.0} for t in tasks}
    results[same[0]["id"]] = {"id": same[0]["id"], "status": "ok", "time_ms": 5.0}
    results[same[1]["id"]] = {"id": same[1]["id"], "status": "crashed"}
    results[same[2]["id"]] = {"id": same[2]["id"], "status": "ok", "time_ms": 3.0}
    first_tasks, merged = bench.merge_rounds(tasks, results)
    assert all(t.get("round", 0) == 0 for t in first_tasks)
    assert merged[same[0]["id"]]["time_ms"] == 4.0
    assert merged[same[0]["id"]]["round_times_ms"] == [5.0, 3.0]
    rows = bench.build_rows([point], first_tasks, merged, {"gemm_tflops": 800, "copy_tbps": 3})
    fwd = [r for r in rows if r["direction"] == "fwd"][0]
    assert fwd["impls"]["torch:cudnn"]["time_ms"] == 4.0


def test_host_pairs_are_differences_within_each_round_both_ran():
    point = bench.host_grid()[0]
    tasks = bench.make_tasks([point], rounds=3)
    results = {}
    for t in tasks:
        if t["kind"] != "measure":
            continue
        # Round r is slow for everyone (drift) and auto is 0.004 ms dearer than cuDNN within it.
        base = 0.25 + 0.05 * t["round"]
        extra = {"fusedattn:auto": 0.004, "fusedattn:cudnn": 0.0}.get(t["impl"], 0.001)
        results[t["id"]] = {"id": t["id"], "status": "ok", "time_ms": base + extra}
    cudnn_round1 = [t for t in tasks if t["kind"] == "measure" and t["impl"] == "fusedattn:cudnn"
                    and t["direction"] == point.directions[0] and t["round"] == 1][0]
    results[cudnn_round1["id"]] = {"id": cudnn_round1["id"], "status": "crashed"}
    first_tasks, merged = bench.merge_rounds(tasks, results)
    rows = bench.build_rows([point], first_tasks, merged, {"gemm_tflops": 800, "copy_tbps": 3})
    lines = bench.paired_differences(rows, pairs=(("fusedattn:auto", "fusedattn:cudnn"),))
    assert len(lines) == len(point.directions)
    first = [line for line in lines if ", %s:" % point.directions[0] in line][0]
    assert "median +4.0 µs over 2 rounds" in first  # round 1 has no cuDNN figure to pair
    others = [line for line in lines if line != first]
    assert all("median +4.0 µs over 3 rounds" in line for line in others)


# Back to back and device only: the timing loops, their arithmetic and the tables of both figures.

class FakeClock:
    """A clock that returns scripted elapsed times (ms), one per stop()."""

    def __init__(self, elapsed):
        self.elapsed = list(elapsed)
        self.starts = 0

    def start(self):
        self.starts += 1

    def stop(self):
        return self.elapsed.pop(0)


def test_back_to_back_divides_each_loop_by_its_calls_and_keeps_the_median():
    issued = []
    clock = FakeClock([8.0, 4.0, 40.0])
    per_call, host = bench.back_to_back(issued.append, 3, 4, 3, clock)
    assert issued == [0, 1, 2, 0] * 3  # one after another, the input sets rotated
    assert clock.starts == 3
    assert per_call == 2.0  # median of 8/4, 4/4, 40/4
    assert 0 <= host < 1.0  # the host's issue time of a no-op call


def test_back_to_back_loops_are_long_enough_within_bounds():
    assert bench.back_to_back_calls(0.5, 30, 50.0, 2000) == 100
    assert bench.back_to_back_calls(10.0, 30, 50.0, 2000) == 30  # at least 30
    assert bench.back_to_back_calls(0.001, 30, 50.0, 2000) == 2000  # at most 2000
    assert bench.back_to_back_calls(0.0, 30, 50.0, 2000) == 2000
    assert bench.back_to_back_calls(0.5, 2000, 50.0, 2000) == 2000  # the host grid


def test_device_sleep_outlasts_twice_the_host_time_of_a_call():
    # 1.2 ms of host time per call at 1.98 GHz: 2 * 1.2 + 0.05 ms of sleep.
    assert bench.device_sleep_cycles(1.2, 1.98e6, 2_000_000) == math.ceil(1.98e6 * 2.45)
    assert bench.device_sleep_cycles(0.01, 1.98e6, 2_000_000) == 2_000_000  # the least


def test_settings_host_grid_issues_2000_calls_and_the_cpu_few():
    host = bench.settings_for(host=True)
    assert host["b2b_calls"] == host["b2b_max_calls"] == 2000 and host["b2b_loops"] == 1
    assert host["warmup"] >= 100
    cpu = bench.settings_for(quick=True, host=True, device="cpu")
    assert cpu["b2b_calls"] * cpu["b2b_loops"] + cpu["runs"] <= 20


def test_time_both_ways_warms_up_probes_then_times_back_to_back_and_device_only():
    settings = bench.settings_for(device="cpu")
    issued = []
    result = bench.time_both_ways(issued.append, 2, settings, {}, device="cpu")
    assert set(result) == {"time_ms", "device_ms", "host_ms", "calls"}
    assert result["calls"] == settings["b2b_calls"]
    assert len(issued) == settings["warmup"] + settings["probe_calls"] + \
        result["calls"] * settings["b2b_loops"] + settings["runs"]
    assert set(issued) == {0, 1}


def _both(b2b, device, **extra):
    return dict({"status": "ok", "time_ms": b2b, "device_ms": device}, **extra)


def test_analyze_computes_ratio_and_floor_on_both_timings():
    p = prefill()
    # Ours: slower than torch:cudnn back to back (host cost), faster on the device.
    results = _results(fusedattn_auto=_both(4.0, 1.8, backend="cudnn", host_ms=3.9),
                       torch_cudnn=_both(2.0, 2.0), fa4=_both(2.5, 1.5))
    row = bench.analyze(p, "fwd", results, DEVICE)
    ours = row["impls"]["fusedattn:auto"]
    assert ours["time_ms"] == 4.0 and ours["device"]["time_ms"] == 1.8
    assert ours["tflops"] == pytest.approx(bench.flops(p) / 4e-3 / 1e12)
    assert ours["device"]["tflops"] == pytest.approx(bench.flops(p) / 1.8e-3 / 1e12)
    assert ours["host_ms"] == 3.9
    assert row["best_other"] == "torch:cudnn" and row["ours_over_best"] == pytest.approx(0.5)
    assert row["device"]["best_other"] == "fa4"
    assert row["device"]["ours_over_best"] == pytest.approx(1.5 / 1.8)
    floor_s = max(bench.flops(p) / 750e12, bench.bytes_moved(p) / 3e12)
    assert row["ours_floor_fraction"] == pytest.approx(floor_s / 4e-3)
    assert row["device"]["ours_floor_fraction"] == pytest.approx(floor_s / 1.8e-3)


def test_markdown_tables_show_back_to_back_first_and_device_only_on_request():
    p = prefill()
    results = _results(fusedattn_auto=_both(4.0, 2.0, backend="cudnn"),
                       torch_cudnn=_both(2.0, 2.5),
                       fa4={"status": "unsupported", "error": "not importable"})
    rows = [bench.analyze(p, "fwd", results, DEVICE)]
    for device, ours_ms, ratio in ((False, 4.0, "0.50"), (True, 2.0, "1.25")):
        table = bench.markdown_table(rows, "tflops", device=device)
        cells = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
        assert cells[2] == "%s (cudnn)" % bench.three_digits(bench.flops(p) / ours_ms / 1e12 * 1e3)
        assert cells[4] == "n/a" and cells[5] == ratio
        assert ("device only" in table) == device and ("back to back" in table) != device


def test_write_markdown_has_both_tables_per_grid_and_says_why_fa4_did_not_run(tmp_path):
    points = [prefill(), prefill(mask="causal")]
    tasks = bench.make_tasks(points)
    results = {}
    for t in tasks:
        if t.get("impl") == bench.FA4:
            results[t["id"]] = {"id": t["id"], "status": "unsupported",
                                "error": "FlashAttention-4 (flash_attn.cute) is not importable: "
                                         "ModuleNotFoundError: No module named 'flash_attn'"}
        else:
            results[t["id"]] = {"id": t["id"], "status": "ok", "time_ms": 2.0, "device_ms": 1.0}
    rows = bench.build_rows(points, tasks, results, DEVICE)
    bench.write_markdown(str(tmp_path / "r.md"), [("prefill", rows, "tflops")],
                         dict(DEVICE, fa4="not importable (...)"))
    text = (tmp_path / "r.md").read_text()
    headline, device_only = text.index("Back to back (the headline)"), text.index("Device only")
    assert headline < device_only
    assert "- fa4: FlashAttention-4 (flash_attn.cute) is not importable: " in text
    assert "FlashAttention-4: not importable" in text
    bench.write_json(str(tmp_path / "r.json"), [("prefill", rows, "tflops")], DEVICE, points, [])
    data = json.loads((tmp_path / "r.json").read_text())
    entry = data["rows"][0]["impls"]["fusedattn:auto"]
    assert entry["time_ms"] == 2.0 and entry["device"]["time_ms"] == 1.0
    assert {"time_ms", "device_ms", "host_ms"} <= set(data["timing"])


def test_merged_rounds_keep_the_median_of_each_timing():
    point = prefill()
    tasks = bench.make_tasks([point], rounds=3)
    same = [t for t in tasks if t["kind"] == "measure" and t["impl"] == "fa4"
            and t["direction"] == "bwd"]
    results = {t["id"]: {"id": t["id"], "status": "ok", "time_ms": 1.0} for t in tasks}
    for t, (b2b, device, host) in zip(same, ((3.0, 1.0, 0.2), (5.0, 2.0, 0.1), (4.0, 9.0, 0.3))):
        results[t["id"]] = _both(b2b, device, host_ms=host, id=t["id"])
    _, merged = bench.merge_rounds(tasks, results)
    result = merged[same[0]["id"]]
    assert (result["time_ms"], result["device_ms"], result["host_ms"]) == (4.0, 2.0, 0.2)
    assert result["round_device_ms"] == [1.0, 2.0, 9.0]


def test_table_columns_keep_one_order_across_points():
    assert bench.table_order({"flex", "torch:varlen", "fa4", "fusedattn:auto", "torch:cudnn"}) == [
        "fusedattn:auto", "torch:cudnn", "torch:varlen", "fa4", "flex"]


def test_every_grid_has_fa4_as_a_peer_and_it_counts_as_the_best_other():
    for grid in list(bench.GRIDS.values()) + [bench.smoke_grid, bench.host_grid]:
        for p in grid():
            assert bench.FA4 in bench.implementations(p)
    assert not bench.is_ours(bench.FA4)


def test_fa4_not_importable_is_unsupported_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # makes the import fail
    with pytest.raises(bench.Unsupported) as caught:
        bench.import_fa4()
    assert "(flash_attn.cute) is not importable: ModuleNotFoundError" in str(caught.value)
    status, message = bench.classify_error(caught.value)
    assert status == "unsupported" and message == str(caught.value)
    assert bench.fa4_version().startswith("not importable")


def test_fa4_refusals_by_assertion_are_unsupported_not_failures():
    refusal = AssertionError("(head_dim, head_dim_v)=(512, 512) is not supported on SM90.")
    assert bench.classify_error(refusal)[0] == "unsupported"
    assert bench.classify_error(AssertionError("shape mismatch"))[0] == "failed"


def test_host_grid_is_one_small_point_with_three_directions():
    (p,) = bench.host_grid()
    assert (p.batch, p.seqlen_q, p.seqlen_kv, p.heads_q, p.head_dim, p.dtype) == (
        1, 128, 128, 4, 64, "bf16")
    assert p.directions == ("fwd", "fwd-train", "fwd+bwd") and p.unit == "us"
    assert bench.implementations(p) == [
        "fusedattn:auto", "fusedattn:cudnn", "fusedattn:flash", "torch:flash", "torch:cudnn",
        "torch:efficient", "fa4"]
    assert "host" not in bench.GRIDS  # not part of "all"
    assert bench.flops(p, "fwd-train") == bench.flops(p)
    assert bench.bytes_moved(p, "fwd-train") == bench.bytes_moved(p)


def test_host_grid_default_rounds_rotate_the_implementations():
    (p,) = bench.host_grid()
    tasks = bench.make_tasks([p], rounds=bench.HOST_ROUNDS)
    firsts = [next(t["impl"] for t in tasks if t.get("round") == r) for r in range(3)]
    assert bench.HOST_ROUNDS >= 3 and len(set(firsts)) == 3


def test_host_table_has_a_line_per_implementation_in_microseconds():
    (p,) = bench.host_grid()
    times = {"fusedattn:auto": (0.241, 0.012, 1.174, 0.040), "torch:flash": (0.048, 0.010,
                                                                             0.235, 0.030)}
    rows = []
    for n, direction in enumerate(p.directions):
        results = {impl: _both(t[0] * (1 + n), t[1], backend="cudnn") for impl, t in
                   times.items()}
        results["fa4"] = {"status": "unsupported", "error": "not importable"}
        rows.append(bench.analyze(p, direction, results, DEVICE))
    table = bench.host_table(rows)
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[0].startswith("µs per warm call, bf16 d64 h4 b1 sq128 skv128")
    assert header[1:] == ["fwd", "fwd-train", "fwd+bwd", "device: fwd", "device: fwd-train",
                          "device: fwd+bwd"]
    ours = [c.strip() for c in lines[2].strip("|").split("|")]
    assert ours == ["fusedattn:auto (cudnn)", "241", "482", "723", "12.0", "12.0", "12.0"]
    theirs = [c.strip() for c in lines[3].strip("|").split("|")]
    assert theirs[0] == "torch:flash" and theirs[1] == "48.0"
    assert [c.strip() for c in lines[4].strip("|").split("|")] == ["fa4"] + ["n/a"] * 6


def test_host_grid_markdown_uses_the_host_table_and_no_plot(tmp_path):
    points = bench.host_grid()
    tasks = bench.make_tasks(points)
    results = {t["id"]: _both(0.2, 0.01, id=t["id"]) for t in tasks}
    rows = bench.build_rows(points, tasks, results, DEVICE)
    assert [r["direction"] for r in rows] == ["fwd", "fwd-train", "fwd+bwd"]
    bench.write_markdown(str(tmp_path / "r.md"), [("host", rows, "us")], DEVICE)
    text = (tmp_path / "r.md").read_text()
    assert "µs per warm call" in text and "ours/best" not in text
    assert bench.write_plot(str(tmp_path / "r.png"), [("host", rows, "us")]) is False
    assert not (tmp_path / "r.png").exists()


def test_log_lines_put_the_back_to_back_time_first():
    point = prefill()
    tasks = [{"id": 1, "kind": "measure", "point": point.to_dict(), "impl": "fa4",
              "direction": "fwd"}]
    line = bench.describe_result(_both(1.5, 1.25, host_ms=0.02, id=1), tasks)
    import log_table
    match = log_table.LINE.match(line)
    assert match and match["impl"] == "fa4" and match["rest"].startswith("1.5000 ms back to back")
    assert "1.2500 ms device only" in line and "host 20.0 us" in line


@pytest.mark.parametrize("grid", ["smoke", "host"])
def test_cpu_dry_run_times_both_ways_and_records_fa4_as_unsupported(grid, tmp_path):
    """bench.py --device cpu end to end (needs torch and the fusedattn package): every task
    has both timings, FlashAttention-4 is n/a with its reason, the tables are written."""
    pytest.importorskip("torch", reason="torch is not installed here")
    pytest.importorskip("fusedattn", reason="the fusedattn package is not installed here")
    import subprocess
    only = "fusedattn:auto,torch:flash,fa4" + (",torch:math" if grid == "smoke" else "")
    out = subprocess.run([sys.executable, os.path.join(BENCH_DIR, "bench.py"), "--grid", grid,
                          "--quick", "--device", "cpu", "--only", only, "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    for row in data["rows"]:
        fa4 = row["impls"]["fa4"]
        assert fa4["status"] == "unsupported", fa4
        assert "is not importable" in fa4["error"] or "CUDA only" in fa4["error"], fa4
        ours = row["impls"]["fusedattn:auto"]
        assert ours["status"] == "ok", ours
        assert ours["time_ms"] > 0 and ours["device"]["time_ms"] > 0 and ours["host_ms"] > 0
    text = next(tmp_path.glob("*.md")).read_text()
    if grid == "host":
        assert "µs per warm call" in text and len(data["rows"]) == 3
        assert len([t for t in data["raw"] if t["kind"] == "measure"]) == 3 * 3 * bench.HOST_ROUNDS
    else:
        assert "Back to back (the headline)" in text and "Device only" in text


def test_the_chosen_backend_is_read_from_explain_with_or_without_a_note():
    assert bench._chosen("forward: cudnn; not chosen: small_seq: sq > 1") == "cudnn"
    assert bench._chosen("forward+backward: cudnn [plans: forward: unified SDPA node, per "
                         "shape]; not chosen: small_seq: ...") == "cudnn"
    assert bench._chosen("forward: flash (forced)") == "flash"


def test_the_speed_table_takes_dense_rows_with_both_backends_measured(tmp_path):
    """bench/make_speed_table.py: one entry per (class, seqlen, direction) that has both
    fusedattn:cudnn and fusedattn:flash; varlen, unsupported and one-sided rows are left out."""
    import make_speed_table

    def row(point, direction, cudnn, flash):
        impls = {"fusedattn:cudnn": {"status": "ok", "tflops": cudnn}}
        impls["fusedattn:flash"] = ({"status": "ok", "tflops": flash} if flash else
                                    {"status": "unsupported"})
        return {"point": point, "direction": direction, "unit": "tflops", "impls": impls}

    results = {"device": {"name": "GPU X", "date": "2026-11-25"}, "rows": [
        row("bf16 d128 h16 b1 sq16384 skv16384 causal", "fwd", 600.0, 650.0),
        row("bf16 d128 h16/4 b1 sq16384 skv16384", "fwd+bwd", 500.0, 450.0),
        row("bf16 d128 h16 b1 sq16384 skv16384", "bwd", 500.0, 450.0),  # no table direction
        row("fp16 d64 h32 b1 sq16384 skv16384", "fwd", 400.0, None),    # flash unsupported
        row("bf16 d128 h16 varlen4[1,2,3,4] causal", "fwd", 1.0, 2.0),  # not dense
    ]}
    source = tmp_path / "prefill.json"
    source.write_text(json.dumps(results))
    out = tmp_path / "table.inc"
    assert make_speed_table.main(["--sm", "90", "--out", str(out), str(source)]) == 0
    text = out.read_text()
    assert '"GPU X, 2026-11-25"' in text
    assert "bench/results/prefill.json" in text
    assert "{90, FUSEDATTN_DTYPE_BFLOAT16, 128, true, false, false, 16384, 600.0, 650.0}" in text
    assert "{90, FUSEDATTN_DTYPE_BFLOAT16, 128, false, true, true, 16384, 500.0, 450.0}" in text
    assert text.count("{90,") == 2
