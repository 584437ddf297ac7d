"""The pure parts of bench/bench.py (the benchmark harness), on the CPU: grids, FLOP and byte
counting, rows, tables, output names, and the driver's recovery from a worker that dies."""

import json
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
        assert 1 <= len(points) <= 2 and len(tasks) <= 45, name
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
