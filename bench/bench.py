#!/usr/bin/env python3
"""Side-by-side attention benchmark: fusedattn (every backend that accepts the problem, and auto)
against FlashAttention-4, PyTorch's SDPA backends (cuDNN, flash, efficient; math on the small-seq
grid) and compiled FlexAttention, on the same input tensors, in one run.

    python bench/bench.py --grid prefill|varlen|small_seq|decode|all|host [--quick] [--out DIR]

writes bench/results/<grid>-<device>-<date>.{md,json,png} (one section per grid for "all"; the
host grid, not part of "all", has no plot).

How it measures
* Every (point, implementation, direction) is a task run by a worker subprocess; the driver (this
  process, which never touches CUDA) restarts the worker when a task kills it or poisons its CUDA
  context (PyTorch's flash backward has hit an illegal memory access at skv=2), records that task
  as failed, and goes on. Unsupported problems (FlashAttention-4 when `flash_attn.cute` is not
  importable, with the reason), out-of-memory and exceptions are recorded too.
* Directions, each timed on its own: forward (under torch.no_grad); backward alone
  (autograd.grad on a retained graph); forward+backward as one call (forward, then
  autograd.grad). The host grid adds fwd-train: the forward with inputs that require grad (the
  autograd graph is recorded), no backward.
* Every task is timed two ways, after the same warm-up (which also absorbs FlashAttention-4's
  and FlexAttention's compilation of a new shape):
  - back to back, the headline: N calls issued one after another as a training loop or a server
    issues them (no pause, no synchronization, input sets rotated) between two CUDA events;
    time per call = elapsed / N, so the host's cost of a call (Python, dispatch, launches) counts
    wherever it exceeds the GPU's. N is large enough for a loop of ~50 ms (at least 20 calls;
    2000 on the host grid); the median over 3 loops (1 on the host grid, which has rounds).
    The host's wall time to issue a call in that loop is kept too (host_ms in the JSON).
  - device only, beside it: each call between CUDA events after a GPU sleep that outlasts the
    host's issuing of that call (twice the host_ms above, at least ~1 ms), so that only the
    GPU's time of the call is measured; the median of many calls, inputs rotated.
  Input sets together exceed the L2 cache. --rounds N times every task N times with the
  implementations rotated each round and keeps the median of each figure.
* FLOPs: 4 * b * h * d * (attended query-key pairs): sq * skv, or sq * skv - sq^2 / 2 under a
  causal mask with sq <= skv (half of sq * skv for square prefill); x2.5 for the backward alone,
  x3.5 for forward+backward. Bytes: q, k, v, o and lse once; the backward adds dO, dQ, dK, dV.
* The floor of a point is max(FLOPs / GEMM rate, bytes / copy bandwidth), both measured on the
  device in the same run (bf16 8192^3 matmul; large device-to-device copy, bytes read + written);
  "floor" in the tables is floor time / measured time.
* "ours / best" is fusedattn auto's rate over the best other implementation's rate. The first
  table of every grid computes both on the back-to-back times, the second on the device times.
* The host grid (--grid host) is one small problem (b=1 s=128 h=4 d=64 bf16) where a call costs
  the host more than the GPU: microseconds per warm call, back to back and device only, for
  fusedattn (auto, cudnn, flash), PyTorch SDPA (flash, cuDNN, efficient) and FlashAttention-4;
  one loop of 2000 calls per task after 100 warm-up calls, the median over 5 rounds by default.

The pure parts (grids, counting, tables, the timing arithmetic) import without torch and are
unit-tested on the CPU (python/tests/test_bench_harness.py). `--device cpu --grid smoke` (or
`--grid host`) is a dry run of the whole harness on CPU tensors; its figures mean nothing.
"""

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results")

# ---------------------------------------------------------------------------------------------
# Points and grids
# ---------------------------------------------------------------------------------------------

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DIRECTIONS = ("fwd", "bwd", "fwd+bwd")
# fwd-train: the forward with inputs that require grad (graph recorded, no backward); only the
# host grid times it on its own.
HOST_DIRECTIONS = ("fwd", "fwd-train", "fwd+bwd")
# FLOP multipliers of each direction relative to the forward's.
DIRECTION_FLOPS = {"fwd": 1.0, "fwd-train": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


@dataclasses.dataclass(frozen=True)
class Point:
    """One problem. lens (THD varlen): per-sequence lengths of q and kv (self-attention,
    batch = len(lens)); then seqlen_q/kv are the largest. mask: "none", "causal" (top-left,
    square) or "causal_bottom_right"."""
    grid: str
    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    head_dim: int
    mask: str = "none"
    lens: tuple = ()
    directions: tuple = DIRECTIONS
    unit: str = "tflops"  # what the tables show: "tflops", "tbps" or "us" (the host grid)

    @property
    def varlen(self):
        return bool(self.lens)

    @property
    def causal(self):
        return self.mask != "none"

    @property
    def label(self):
        if self.varlen:
            shape = "varlen%d[%s]" % (len(self.lens), ",".join(str(n) for n in self.lens))
        else:
            shape = "b%d sq%d skv%d" % (self.batch, self.seqlen_q, self.seqlen_kv)
        heads = "h%d" % self.heads_q if self.heads_q == self.heads_kv else \
            "h%d/%d" % (self.heads_q, self.heads_kv)
        mask = "" if self.mask == "none" else " " + self.mask
        return "%s d%d %s %s%s" % (self.dtype, self.head_dim, heads, shape, mask)

    @property
    def key(self):
        return "%s|%s" % (self.grid, self.label)

    def to_dict(self):
        d = dataclasses.asdict(self)
        d["lens"] = list(self.lens)
        d["directions"] = list(self.directions)
        return d

    @staticmethod
    def from_dict(d):
        d = dict(d)
        d["lens"] = tuple(d.get("lens", ()))
        d["directions"] = tuple(d.get("directions", DIRECTIONS))
        return Point(**d)


def attended_pairs(seqlen_q, seqlen_kv, causal):
    """Query-key pairs a sequence computes: sq * skv, or under a causal mask with sq <= skv
    (square top-left, or bottom-right) sq * skv - sq^2 / 2, which is half of sq * skv when square
    (the usual convention)."""
    if not causal:
        return seqlen_q * seqlen_kv
    if seqlen_q > seqlen_kv:  # bottom-right with rows that see nothing; not used by the grids
        return seqlen_kv * seqlen_kv / 2
    return seqlen_q * seqlen_kv - seqlen_q * seqlen_q / 2


def flops(point, direction="fwd"):
    """4 * h * d * pairs over the sequences, times the direction's multiplier."""
    if point.varlen:
        pairs = sum(attended_pairs(n, n, point.causal) for n in point.lens)
    else:
        pairs = point.batch * attended_pairs(point.seqlen_q, point.seqlen_kv, point.causal)
    return 4.0 * point.heads_q * point.head_dim * pairs * DIRECTION_FLOPS[direction]


def bytes_moved(point, direction="fwd"):
    """Bytes read and written once: q, k, v, o and lse (float32) for the forward; the backward
    reads q, k, v, o, lse, dO and writes dQ, dK, dV; forward+backward is both."""
    e = DTYPE_BYTES[point.dtype]
    if point.varlen:
        tokens_q = tokens_kv = sum(point.lens)
    else:
        tokens_q, tokens_kv = point.batch * point.seqlen_q, point.batch * point.seqlen_kv
    q = o = tokens_q * point.heads_q * point.head_dim * e
    k = v = tokens_kv * point.heads_kv * point.head_dim * e
    lse = tokens_q * point.heads_q * 4
    forward = q + k + v + o + lse
    backward = forward + o + q + k + v  # + dO, dQ, dK, dV
    return {"fwd": forward, "fwd-train": forward, "bwd": backward,
            "fwd+bwd": forward + backward}[direction]


def uneven_lengths(total, count, seed=0, smallest=64):
    """count deterministic uneven lengths, multiples of 64, summing to total."""
    import random
    rng = random.Random(seed)
    weights = [rng.uniform(0.15, 1.85) for _ in range(count)]
    scale = (total - smallest * count) / sum(weights)
    lens = [smallest + int(w * scale) // 64 * 64 for w in weights]
    lens[-1] += total - sum(lens)
    return tuple(lens)


def prefill_grid(quick=False):
    """bf16/fp16, d 64/128/256, seqlen 512..16384 at 16k tokens (batch = 16384 / seqlen),
    heads = 2048 / d, causal or not."""
    points = []
    dtypes = ("bf16",) if quick else ("bf16", "fp16")
    dims = (128,) if quick else (64, 128, 256)
    seqlens = (4096,) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    masks = ("causal",) if quick else ("none", "causal")
    for dtype in dtypes:
        for d in dims:
            for s in seqlens:
                for mask in masks:
                    points.append(Point("prefill", dtype, 16384 // s, 2048 // d, 2048 // d, s, s,
                                        d, mask))
    return points


def varlen_grid(quick=False):
    """THD with uneven lengths at 16k tokens, and the dense equivalent (same token count,
    uniform lengths)."""
    points = []
    dims = (128,) if quick else (64, 128)
    counts = (8,) if quick else (4, 8, 32)
    masks = ("causal",) if quick else ("none", "causal")
    for d in dims:
        for count in counts:
            lens = uneven_lengths(16384, count, seed=count)
            for mask in masks:
                h = 2048 // d
                points.append(Point("varlen", "bf16", count, h, h, max(lens), max(lens), d, mask,
                                    lens=lens))
                s = 16384 // count
                points.append(Point("varlen", "bf16", count, h, h, s, s, d, mask))
    return points


def small_seq_grid(quick=False):
    """sq = 1, b = 30720, h = 8, short K/V: memory-bound, forward and backward."""
    dims = (128,) if quick else (128, 256, 512)
    skvs = (16,) if quick else (2, 4, 8, 16)
    return [Point("small_seq", "bf16", 30720, 8, 8, 1, skv, d, "none",
                  directions=("fwd", "bwd"), unit="tbps")
            for d in dims for skv in skvs]


def decode_grid(quick=False):
    """sq << skv with causal bottom-right (decode and speculative decode against a KV cache),
    GQA 32/8, forward (inference)."""
    points = []
    sqs = (4,) if quick else (1, 4, 16, 64)
    skvs = (8192,) if quick else (2048, 8192, 32768)
    for sq in sqs:
        for skv in skvs:
            batch = max(1, 65536 // skv)
            mask = "none" if sq == 1 else "causal_bottom_right"
            points.append(Point("decode", "bf16", batch, 32, 8, sq, skv, 128, mask,
                                directions=("fwd",), unit="tbps"))
    return points


def smoke_grid(quick=False):
    """Tiny problems of every kind: checks the harness end to end in seconds (also on the CPU
    with --device cpu); its figures mean nothing."""
    return [Point("smoke", "bf16", 2, 4, 4, 128, 128, 64, "causal"),
            Point("smoke", "bf16", 3, 4, 4, 192, 192, 64, "causal", lens=(64, 128, 192)),
            Point("smoke", "bf16", 64, 4, 4, 1, 4, 64, "none", directions=("fwd", "bwd"),
                  unit="tbps"),
            Point("smoke", "bf16", 2, 8, 2, 4, 256, 64, "causal_bottom_right",
                  directions=("fwd",), unit="tbps")]


def host_grid(quick=False):
    """The host's cost of a warm call: one problem so small (b=1 s=128 h=4 d=64 bf16) that the
    GPU's time is a few microseconds and a call back to back costs what the host spends on it."""
    return [Point("host", "bf16", 1, 4, 4, 128, 128, 64, "none", directions=HOST_DIRECTIONS,
                  unit="us")]


GRIDS = {"prefill": prefill_grid, "varlen": varlen_grid, "small_seq": small_seq_grid,
         "decode": decode_grid}
# Not part of "all": the smoke grid checks the harness, the host grid has a table of its own.
EXTRA_GRIDS = {"smoke": smoke_grid, "host": host_grid}
# The host grid's figures are medians over this many rounds unless --rounds says otherwise.
HOST_ROUNDS = 5


# ---------------------------------------------------------------------------------------------
# Implementations
# ---------------------------------------------------------------------------------------------

FUSEDATTN_IMPLS = ("fusedattn:auto", "fusedattn:cudnn", "fusedattn:flash", "fusedattn:small_seq")
OURS = "fusedattn:auto"
FA4 = "fa4"  # FlashAttention-4: flash_attn.cute.flash_attn_func / flash_attn_varlen_func
# The host grid's implementations (the table the issue quotes), in its order.
HOST_IMPLS = ("fusedattn:auto", "fusedattn:cudnn", "fusedattn:flash", "torch:flash",
              "torch:cudnn", "torch:efficient", FA4)


def table_order(impls):
    """impls in the order of the tables' columns: ours, PyTorch's, FlashAttention-4, Flex (a
    grid's points have different sets, e.g. torch:varlen only on THD points)."""
    order = list(FUSEDATTN_IMPLS) + ["torch:cudnn", "torch:flash", "torch:efficient",
                                     "torch:math", "torch:varlen", FA4, "flex"]
    return sorted(impls, key=lambda i: order.index(i) if i in order else len(order))


def implementations(point, quick=False):
    """The implementations timed on a point, in table order. --quick leaves FlexAttention out of
    the memory-bound grids: compiling it for each new shape takes most of a quick run's time."""
    if point.grid == "host":
        return list(HOST_IMPLS)
    impls = list(FUSEDATTN_IMPLS)
    if point.varlen:
        impls += ["torch:varlen"]
    else:
        impls += ["torch:cudnn", "torch:flash", "torch:efficient"]
        if point.grid in ("small_seq", "smoke"):
            impls.append("torch:math")
    impls.append(FA4)  # everywhere: where it refuses a problem, the table says n/a
    if not (quick and point.grid in ("small_seq", "decode")):
        impls.append("flex")
    return impls


def is_ours(impl):
    return impl.startswith("fusedattn:")


# ---------------------------------------------------------------------------------------------
# Results: rates, ratios, floors, tables
# ---------------------------------------------------------------------------------------------

def rates(point, direction, time_ms, floor_s):
    """The figures of one time: time_ms, tflops, tbps, floor_fraction (None without a floor)."""
    seconds = time_ms / 1e3
    return {"time_ms": time_ms,
            "tflops": flops(point, direction) / seconds / 1e12,
            "tbps": bytes_moved(point, direction) / seconds / 1e12,
            "floor_fraction": floor_s / seconds if floor_s else None}


def compare(impls, floor_s):
    """{best_other, ours_over_best, ours_floor_fraction} over one figure of every implementation
    ({impl: rates dict or None}): the best is the shortest time among the implementations that
    are not ours."""
    others = {i: e for i, e in impls.items() if not is_ours(i) and e}
    best_other = min(others, key=lambda i: others[i]["time_ms"]) if others else None
    ours = impls.get(OURS)
    return {"best_other": best_other,
            "ours_over_best": (others[best_other]["time_ms"] / ours["time_ms"]
                               if best_other and ours else None),
            "ours_floor_fraction": ours["floor_fraction"] if ours else None}


def analyze(point, direction, results, device):
    """One row: per implementation its status and figures, and ours / best other and our floor
    fraction, for both timings. results: {impl: task result dict} whose time_ms is the
    back-to-back time per call and device_ms the device-only time. device: {"copy_tbps",
    "gemm_tflops"}.

    Row layout: each implementation's entry has the back-to-back figures at its top level
    (time_ms, tflops, tbps, floor_fraction) and the device-only ones under "device" (the same
    keys); the row has best_other / ours_over_best / ours_floor_fraction on the back-to-back
    times at its top level and on the device times under "device"."""
    f, b = flops(point, direction), bytes_moved(point, direction)
    floor_s = max(f / (device["gemm_tflops"] * 1e12) if device.get("gemm_tflops") else 0.0,
                  b / (device["copy_tbps"] * 1e12) if device.get("copy_tbps") else 0.0)
    row = {"point": point.label, "grid": point.grid, "direction": direction, "unit": point.unit,
           "flops": f,
           "bytes": b, "floor_ms": floor_s * 1e3, "bound": None, "impls": {}}
    if device.get("gemm_tflops") and device.get("copy_tbps"):
        compute_s = f / (device["gemm_tflops"] * 1e12)
        memory_s = b / (device["copy_tbps"] * 1e12)
        row["bound"] = "compute" if compute_s >= memory_s else "memory"
    for impl, r in results.items():
        entry = {"status": r.get("status", "failed")}
        for key in ("error", "backend", "host_ms", "calls", "round_times_ms", "rounds_ok"):
            if r.get(key):
                entry[key] = r[key]
        if entry["status"] == "ok":
            entry.update(rates(point, direction, r["time_ms"], floor_s))
            entry["device"] = (rates(point, direction, r["device_ms"], floor_s)
                               if r.get("device_ms") else None)
        row["impls"][impl] = entry
    ok = {i: e for i, e in row["impls"].items() if e["status"] == "ok"}
    row.update(compare(ok, floor_s))
    row["device"] = compare({i: e["device"] for i, e in ok.items()}, floor_s)
    return row


def _short_status(entry):
    status = entry["status"]
    if status == "ok":
        return None
    text = entry.get("error", status)
    if status == "unsupported":
        return "n/a"
    if "out of memory" in text.lower() or "OutOfMemory" in text:
        return "OOM"
    if status == "crashed":
        return "crash"
    return "fail"


def three_digits(x):
    """605 / 60.5 / 6.05 / 0.605: three significant digits, no exponent."""
    for limit, fmt in ((100, "%.0f"), (10, "%.1f"), (1, "%.2f")):
        if x >= limit:
            return fmt % x
    return "%.3f" % x


def format_rate(entry, unit, device=False):
    """The cell of one implementation: its rate (back to back, or device only), or its status."""
    short = _short_status(entry)
    if short:
        return short
    figures = entry.get("device") if device else entry
    if not figures:
        return "-"
    return three_digits(figures["tflops"] if unit == "tflops" else figures["tbps"])


TIMINGS = {False: "back to back: calls issued one after another, host cost included",
           True: "device only: the GPU's time of a call (a GPU sleep hides the host's)"}


def markdown_table(rows, unit, device=False):
    """A Markdown table of rows (from analyze) with one column per implementation; rates in
    unit ("tflops" or "tbps"), or in each row's own unit where it has one. device=False: the
    back-to-back figures (the headline); True: the device-only figures, ratio and floor
    computed on those."""
    impls = table_order({impl for row in rows for impl in row["impls"]})
    header = ["point", "dir"] + impls + ["ours/best", "ours floor"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["point"], row["direction"]]
        for impl in impls:
            entry = row["impls"].get(impl)
            cell = format_rate(entry, row.get("unit", unit), device) if entry else ""
            if impl == OURS and entry and entry.get("backend"):
                cell += " (%s)" % entry["backend"]
            cells.append(cell)
        summary = (row.get("device") or {}) if device else row
        ratio = summary.get("ours_over_best")
        cells.append("%.2f" % ratio if ratio is not None else "-")
        fraction = summary.get("ours_floor_fraction")
        cells.append("%.0f%%" % (100 * fraction) if fraction is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    units = sorted({row.get("unit", unit) for row in rows}) or [unit]
    unit_name = " or ".join("TFLOP/s" if u == "tflops" else "TB/s" for u in units)
    return "\n".join(lines) + "\n\nRates in %s, %s. n/a: not supported; OOM: out of memory; " \
        "fail/crash: see the failures below and the JSON.\n" % (unit_name, TIMINGS[device])


def format_us(figures):
    return three_digits(figures["time_ms"] * 1e3) if figures else "-"


def host_table(rows):
    """The host grid's table: one line per implementation, microseconds per warm call for
    each direction back to back, then the same device only (the GPU's part of it)."""
    directions = [row["direction"] for row in rows]
    impls = []  # in the order the rows have them (HOST_IMPLS')
    for row in rows:
        impls += [i for i in row["impls"] if i not in impls]
    point = rows[0]["point"] if rows else ""
    header = ["µs per warm call, %s" % point] + directions + [
        "device: %s" % d for d in directions]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for impl in impls:
        entries = [row["impls"].get(impl) for row in rows]
        backends = sorted({e["backend"] for e in entries if e and e.get("backend")})
        name = impl + (" (%s)" % ", ".join(backends) if impl == OURS and backends else "")
        cells = [name]
        for device in (False, True):
            for entry in entries:
                if not entry:
                    cells.append("")
                elif _short_status(entry):
                    cells.append(_short_status(entry))
                else:
                    cells.append(format_us(entry.get("device") if device else entry))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + (
        "\n\nfwd: the forward under torch.no_grad; fwd-train: the forward with inputs that "
        "require grad (graph recorded, no backward); fwd+bwd: the forward, then "
        "torch.autograd.grad. The first columns are back to back (calls issued one after "
        "another, host cost included); the device columns are the GPU's time of a call alone. "
        "n/a: not supported; fail/crash: see the failures below and the JSON.\n")


# The host grid's paired comparisons: auto against each backend it may choose.
HOST_PAIRS = (("fusedattn:auto", "fusedattn:cudnn"), ("fusedattn:auto", "fusedattn:flash"))


def paired_differences(rows, pairs=HOST_PAIRS):
    """One line per (pair, direction): the per-round differences of the back-to-back time
    (a - b, microseconds), each taken within one round, where the rotated implementations ran
    one after another on the same machine state. Rounds drift by more than the difference asked
    about (the medians of two implementations over different rounds then disagree by tens of
    microseconds); the differences within a round do not carry that drift."""
    lines = []
    for a, b in pairs:
        for row in rows:
            ea, eb = row["impls"].get(a), row["impls"].get(b)
            if not ea or not eb or "rounds_ok" not in ea or "rounds_ok" not in eb:
                continue
            ta = dict(zip(ea["rounds_ok"], ea.get("round_times_ms", [])))
            tb = dict(zip(eb["rounds_ok"], eb.get("round_times_ms", [])))
            diffs = sorted((ta[r] - tb[r]) * 1e3 for r in ta if r in tb)
            if not diffs:
                continue
            lines.append(
                "- %s - %s, %s: median %+.1f µs over %d rounds (the per-round differences, "
                "sorted: %s)" %
                (a, b, row["direction"], statistics.median(diffs), len(diffs),
                 ", ".join("%+.1f" % d for d in diffs)))
    return lines


def unsupported_notes(rows):
    """One line per implementation that ran on none of the rows, with its first reason (e.g.
    FlashAttention-4 not importable), so that a column of n/a says why."""
    notes = []
    for impl in table_order({impl for row in rows for impl in row["impls"]}):
        entries = [row["impls"][impl] for row in rows if impl in row["impls"]]
        if entries and all(e["status"] == "unsupported" for e in entries):
            reason = " ".join(entries[0].get("error", "").split())[:300]
            notes.append("- %s: %s" % (impl, reason))
    return notes


def failure_notes(rows):
    """One line per failed (not merely unsupported) measurement."""
    notes = []
    for row in rows:
        for impl, entry in row["impls"].items():
            if entry["status"] in ("failed", "crashed"):
                error = " ".join(entry.get("error", "").split())[:300]
                notes.append("- %s %s %s: %s" % (row["point"], row["direction"], impl, error))
    return notes


def write_markdown(path, sections, device):
    """sections: [(grid, rows, unit)]."""
    lines = ["# fusedattn benchmark: %s on %s" % (", ".join(g for g, _, _ in sections),
                                                  device.get("name", "?")), ""]
    lines.append("%s; torch %s, cuDNN %s (torch) / %s (fusedattn), fusedattn %s." % (
        device.get("date", "?"), device.get("torch", "?"), device.get("torch_cudnn", "?"),
        device.get("fusedattn_cudnn", "?"), device.get("fusedattn", "?")))
    lines.append("Device copy bandwidth %.2f TB/s (read + write), bf16 GEMM %.0f TFLOP/s." % (
        device.get("copy_tbps") or 0, device.get("gemm_tflops") or 0))
    lines.append("fusedattn backends: %s." % ", ".join(
        "%s: %s" % kv for kv in (device.get("backends") or {}).items()))
    lines.append("FlashAttention-4: %s." % device.get("fa4", "?"))
    lines.append("Every figure is timed two ways in the same task: back to back (calls issued "
                 "one after another, host cost included: the headline) and device only (each "
                 "call after a GPU sleep that hides the host's cost); see bench.py's header.")
    for grid, rows, unit in sections:
        if unit == "us":  # the host grid: microseconds per call, both timings in one table
            lines += ["", "## %s" % grid, "", host_table(rows)]
            paired = paired_differences(rows)
            if paired:
                lines += ["", "Paired by round (back to back, the difference within each round):",
                          ""] + paired + [""]
        else:
            lines += ["", "## %s" % grid, "", "Back to back (the headline):", "",
                      markdown_table(rows, unit),
                      "Device only (the same calls, each after a GPU sleep that hides the "
                      "host's cost):", "", markdown_table(rows, unit, device=True)]
        notes = unsupported_notes(rows)
        if notes:
            lines += ["Not run anywhere in this grid:", ""] + notes + [""]
        notes = failure_notes(rows)
        if notes:
            lines += ["Failures:", ""] + notes + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_json(path, sections, device, points, raw):
    data = {"grids": [g for g, _, _ in sections], "device": device,
            "timing": {"time_ms": "back to back: elapsed / N of N calls issued one after "
                                  "another (host cost included); the headline",
                       "device_ms": "device only: one call between CUDA events after a GPU "
                                    "sleep that outlasts the host's issuing of it",
                       "host_ms": "the host's wall time to issue one call, back to back"},
            "points": [p.to_dict() for p in points],
            "rows": [row for _, rows, _ in sections for row in rows], "raw": raw}
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)


def write_plot(path, sections):
    """Bars of each implementation's back-to-back rate per point, one panel per grid and
    direction. Returns False (and writes nothing) when no section has rates (the host grid's
    microseconds are a table only)."""
    panels = []
    for grid, rows, unit in sections:
        if unit == "us":
            continue
        for direction in DIRECTIONS:
            drows = [r for r in rows if r["direction"] == direction]
            if drows:
                panels.append((grid, direction, drows, unit))
    if not panels:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    widest = max(len(p[2]) for p in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 1.1 * widest), 4.5 * len(panels)),
                             squeeze=False)
    for ax, (grid, direction, drows, unit) in zip(axes[:, 0], panels):
        impls = []  # those with at least one measurement in this panel
        for row in drows:
            impls += [i for i, e in row["impls"].items() if e["status"] == "ok" and i not in impls]
        width = 0.8 / max(1, len(impls))
        for n, impl in enumerate(impls):
            values = [r["impls"].get(impl, {}).get(r.get("unit", unit)) or 0.0 for r in drows]
            ax.bar([i + n * width for i in range(len(drows))], values, width, label=impl)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(drows))])
        ax.set_xticklabels([r["point"] for r in drows], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s" if unit == "tflops" else "TB/s")
        ax.set_title("%s, %s (back to back)" % (grid, direction))
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def device_slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def output_paths(out_dir, grid, device_name, date):
    stem = os.path.join(out_dir, "%s-%s-%s" % (grid, device_slug(device_name), date))
    return {ext: stem + "." + ext for ext in ("md", "json", "png")}


# ---------------------------------------------------------------------------------------------
# Timing: the loops and their arithmetic (pure; the worker passes a clock on CUDA events)
# ---------------------------------------------------------------------------------------------

def settings_for(quick=False, host=False, device="cuda"):
    """Timing settings of a run. warmup: untimed calls first (they also absorb compilation).
    Back to back: loops of b2b_calls calls or more (enough for b2b_loop_ms at the time per call
    that probe_calls calls take), at most b2b_max_calls, b2b_loops loops. Device only: runs
    calls, each after a GPU sleep of at least sleep_cycles. device_runs: the copy and GEMM
    measurements of the device. The host grid issues 2000 calls a loop after a long warm-up;
    the CPU dry run does as little as will exercise every path."""
    settings = {"warmup": 5, "probe_calls": 3, "b2b_calls": 20, "b2b_loop_ms": 50.0,
                "b2b_max_calls": 2000, "b2b_loops": 3, "runs": 30, "sleep_cycles": 2_000_000,
                "device_runs": 20}
    if quick:
        settings.update(warmup=3, b2b_calls=10, b2b_loop_ms=20.0, b2b_loops=2, runs=10,
                        device_runs=5)
    if host:
        # One loop of 2000 calls per task: the repetitions are the rounds (HOST_ROUNDS), with
        # the implementations rotated between them.
        settings.update(warmup=100, b2b_calls=2000, b2b_max_calls=2000, b2b_loops=1, runs=200)
    if device != "cuda":
        settings.update(warmup=2, probe_calls=1, b2b_calls=3, b2b_loop_ms=0.0, b2b_max_calls=3,
                        b2b_loops=2, runs=3, device_runs=3)
    return settings


class HostClock:
    """Elapsed time on the host's clock (the CPU dry run, where the host is the device)."""

    def start(self):
        self.began = time.perf_counter()

    def stop(self):
        """Milliseconds since start()."""
        return (time.perf_counter() - self.began) * 1e3


def back_to_back(call, count, calls, loops, clock):
    """(ms per call, host ms per call), each the median over loops: a loop issues call(i % count)
    for i = 0..calls-1 one after another (the input sets rotated, nothing between the calls, as
    a training loop or a server issues them) between clock.start() and clock.stop(), and
    divides the clock's elapsed time by calls. The host ms is the wall time the host took to
    issue the calls (without waiting for the GPU at the end), per call."""
    per_call, host = [], []
    for _ in range(loops):
        clock.start()
        began = time.perf_counter()
        for i in range(calls):
            call(i % count)
        issued_ms = (time.perf_counter() - began) * 1e3
        per_call.append(clock.stop() / calls)
        host.append(issued_ms / calls)
    return statistics.median(per_call), statistics.median(host)


def back_to_back_calls(estimate_ms, least, loop_ms, most):
    """Calls per back-to-back loop: enough for a loop of loop_ms at estimate_ms per call (so
    that the loop's start and end weigh little), at least least, at most most (least wins)."""
    wanted = math.ceil(loop_ms / estimate_ms) if estimate_ms > 0 else most
    return max(least, min(most, wanted))


def device_sleep_cycles(host_ms, cycles_per_ms, least):
    """GPU clock cycles to sleep before a device-only call: twice the host's time to issue one
    call (host_ms, measured back to back) plus 50 us, so that the call's kernels are all queued
    before the GPU reaches the start event; at least least."""
    return max(least, int(math.ceil(cycles_per_ms * (2 * host_ms + 0.05))))


# ---------------------------------------------------------------------------------------------
# Driver: runs the tasks in worker subprocesses, restarting a worker that dies
# ---------------------------------------------------------------------------------------------

def make_tasks(points, quick=False, rounds=1):
    """The device task, then one task per (point, implementation, direction) and round. Round r
    of a point times the implementations rotated by r, so that with several rounds each one is
    measured at several places in the sequence (after different neighbours, at different GPU
    temperatures); merge_rounds then keeps the median."""
    tasks = [{"id": 0, "kind": "device"}]
    for point in points:
        impls = implementations(point, quick)
        for r in range(rounds):
            shift = r % len(impls)
            for impl in impls[shift:] + impls[:shift]:
                for direction in point.directions:
                    tasks.append({"id": len(tasks), "kind": "measure", "point": point.to_dict(),
                                  "impl": impl, "direction": direction, "round": r})
    return tasks


# The figures of a result that merge_rounds takes the median of (each over the rounds that
# have it), and where it keeps their values per round.
ROUND_FIGURES = {"time_ms": "round_times_ms", "device_ms": "round_device_ms",
                 "host_ms": "round_host_ms"}


def merge_rounds(tasks, results):
    """(tasks of round 0, results) with one result per (point, implementation, direction): the
    first ok round's result with time_ms, device_ms and host_ms each the median over the ok
    rounds (their values in round_times_ms, round_device_ms, round_host_ms), or the first
    round's failure when no round ran."""
    groups = {}
    for task in tasks:
        if task["kind"] != "measure":
            continue
        key = (json.dumps(task["point"], sort_keys=True), task["impl"], task["direction"])
        groups.setdefault(key, []).append(task)
    first_tasks = [t for t in tasks if t["kind"] != "measure" or t.get("round", 0) == 0]
    merged = dict(results)
    for group in groups.values():
        first = min(group, key=lambda t: t.get("round", 0))
        ok = [results[t["id"]] for t in group if results.get(t["id"], {}).get("status") == "ok"]
        if not ok:
            continue
        result = dict(ok[0], id=first["id"])
        for figure, per_round in ROUND_FIGURES.items():
            values = [r[figure] for r in ok if r.get(figure) is not None]
            if values:
                result[per_round] = values
                result[figure] = statistics.median(values)
        # Which round each of round_times_ms is, so that two implementations can be compared
        # round by round (paired_differences).
        result["rounds_ok"] = [t.get("round", 0) for t in group
                               if results.get(t["id"], {}).get("status") == "ok"
                               and results[t["id"]].get("time_ms") is not None]
        merged[first["id"]] = result
    return first_tasks, merged


def run_tasks(tasks, worker_command, settings, log=print, max_restarts=50):
    """Runs tasks in a worker (worker_command(task_file) -> argv); returns {task id: result}.
    A task that the worker started but did not finish (the worker died, or exited after a
    sticky CUDA error) is recorded as crashed, and a new worker takes the rest."""
    results = {}
    pending = list(tasks)
    restarts = 0
    idle_launches = 0  # consecutive workers that died before their first task
    while pending:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"tasks": pending, "settings": settings}, f)
            task_file = f.name
        started = None
        progressed = False
        stderr_tail = []
        try:
            process = subprocess.Popen(worker_command(task_file), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
            import threading

            def drain():
                for line in process.stderr:
                    stderr_tail.append(line.rstrip())
                    del stderr_tail[:-20]
            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
            for line in process.stdout:
                if line.startswith("BEGIN "):
                    started = int(line.split()[1])
                    progressed = True
                elif line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
                    results[result["id"]] = result
                    started = None
                    log(describe_result(result, tasks))
            code = process.wait()
            reader.join(timeout=5)
        finally:
            os.unlink(task_file)
        pending = [t for t in pending if t["id"] not in results]
        if started is not None:
            results[started] = {"id": started, "status": "crashed",
                                "error": "worker exited with code %s during this task: %s"
                                         % (code, " | ".join(stderr_tail[-5:]))}
            log(describe_result(results[started], tasks))
            pending = [t for t in pending if t["id"] != started]
        elif pending and not progressed:
            idle_launches += 1
            if idle_launches >= 2:  # it cannot start at all: say why for every task left
                for t in pending:
                    results[t["id"]] = {"id": t["id"], "status": "failed",
                                        "error": "the worker cannot start (exit code %s): %s"
                                                 % (code, " | ".join(stderr_tail[-5:]))}
                log("worker cannot start: %s" % " | ".join(stderr_tail[-5:]))
                break
        if progressed:
            idle_launches = 0
        if pending:
            restarts += 1
            if restarts > max_restarts:
                for t in pending:
                    results[t["id"]] = {"id": t["id"], "status": "failed",
                                        "error": "not run: too many worker restarts"}
                break
    return results


def describe_result(result, tasks):
    task = next((t for t in tasks if t["id"] == result["id"]), {})
    if task.get("kind") == "device":
        return "device: %s" % {k: result.get(k) for k in ("name", "copy_tbps", "gemm_tflops")}
    point = Point.from_dict(task["point"]) if "point" in task else None
    head = "%s | %s | %s" % (point.label if point else "?", task.get("impl"),
                             task.get("direction"))
    if result.get("status") == "ok":
        # The back-to-back time first: bench/log_table.py reads the first "X ms" of the line.
        text = "%s: %.4f ms back to back" % (head, result["time_ms"])
        if result.get("device_ms") is not None:
            text += ", %.4f ms device only" % result["device_ms"]
        if result.get("host_ms") is not None:
            text += ", host %.1f us to issue" % (result["host_ms"] * 1e3)
        return text
    return "%s: %s %s" % (head, result.get("status"), " ".join(
        str(result.get("error", "")).split())[:160])


def worker_command_for(script):
    return lambda task_file: [sys.executable, script, "--worker", task_file]


# ---------------------------------------------------------------------------------------------
# Worker (GPU): everything below imports torch
# ---------------------------------------------------------------------------------------------

class Unsupported(Exception):
    """The implementation does not run this problem (recorded as n/a, not as a failure)."""


def _torch_dtype(name):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def measure_device(settings):
    """Name, versions, copy bandwidth and GEMM rate of the device the run uses."""
    import torch
    import fusedattn
    device = settings.get("device", "cuda")
    info = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "torch_cudnn": torch.backends.cudnn.version(), "cuda": torch.version.cuda,
            "fusedattn": fusedattn.version(), "fusedattn_cudnn": fusedattn.cudnn_version(),
            "backends": fusedattn.backends()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, sm_count=props.multi_processor_count,
                    l2_bytes=getattr(props, "L2_cache_size", 50 * 2**20),
                    memory_bytes=props.total_memory)
        copy_bytes, gemm_size, gemm_dtype = 1 << 30, 8192, torch.bfloat16
    else:
        import platform
        info.update(name="cpu " + (platform.processor() or platform.machine()),
                    l2_bytes=4 * 2**20)
        copy_bytes, gemm_size, gemm_dtype = 1 << 26, 1024, torch.float32
    info["fa4"] = fa4_version()
    runs = settings.get("device_runs", 20)
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = _time_each(lambda i: dst.copy_(src), 1, runs, warmup=3, device=device)
    info["copy_tbps"] = 2 * copy_bytes / (copy_ms / 1e3) / 1e12
    src = dst = None  # free the copy buffers before the GEMM
    m = gemm_size
    a = torch.randn(m, m, device=device, dtype=gemm_dtype)
    b = torch.randn(m, m, device=device, dtype=gemm_dtype)
    gemm_ms = _time_each(lambda i: a @ b, 1, runs, warmup=3, device=device)
    info["gemm_tflops"] = 2 * m**3 / (gemm_ms / 1e3) / 1e12
    return info


def _time_each(call, count, runs, sleep_cycles=0, warmup=0, device="cuda"):
    """Device only: the median time in ms of call(i % count), i = 0..runs-1, each timed alone.
    On the GPU between CUDA events, each after a GPU sleep of sleep_cycles: when the sleep
    outlasts the host's issuing of the call, every kernel of the call is queued before the GPU
    reaches the start event, so only the GPU's time of the call is measured. On the CPU the
    host clock around each call."""
    for i in range(warmup):
        call(i % count)
    if device != "cuda":
        times = []
        for i in range(runs):
            began = time.perf_counter()
            call(i % count)
            times.append((time.perf_counter() - began) * 1e3)
        return statistics.median(times)
    import torch
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for i in range(runs):
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        starts[i].record()
        call(i % count)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


class CudaClock:
    """Elapsed GPU time between two CUDA events on the current stream (back_to_back's clock).
    start() waits for the GPU to be idle first, so that a loop starts on an empty queue and its
    first call's launch latency counts, as it does for a loop after a synchronizing step."""

    def __init__(self):
        import torch
        self.torch = torch
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def start(self):
        self.torch.cuda.synchronize()
        self.begin.record()

    def stop(self):
        self.end.record()
        self.torch.cuda.synchronize()
        return self.begin.elapsed_time(self.end)


def _sleep_cycles_per_ms(state):
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured once per worker."""
    if "cycles_per_ms" not in state:
        import torch
        cycles = 20_000_000  # ~10 ms at H100 clocks: long enough to time to 1%
        torch.cuda._sleep(100_000)  # the sleep kernel's first launch is not timed
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        state["cycles_per_ms"] = cycles / begin.elapsed_time(end)
    return state["cycles_per_ms"]


def time_both_ways(call, count, settings, state, device="cuda"):
    """Times call(i) (i picks one of count input sets) back to back and device only, after one
    warm-up: {time_ms (back to back), device_ms, host_ms, calls (per back-to-back loop)}."""
    for i in range(settings["warmup"]):
        call(i % count)
    clock = CudaClock() if device == "cuda" else HostClock()
    # A short back-to-back probe sizes the loops: enough calls for b2b_loop_ms each.
    estimate_ms, _ = back_to_back(call, count, settings["probe_calls"], 1, clock)
    calls = back_to_back_calls(estimate_ms, settings["b2b_calls"], settings["b2b_loop_ms"],
                               settings["b2b_max_calls"])
    time_ms, host_ms = back_to_back(call, count, calls, settings["b2b_loops"], clock)
    sleep = 0
    if device == "cuda":
        sleep = device_sleep_cycles(host_ms, _sleep_cycles_per_ms(state),
                                    settings["sleep_cycles"])
    device_ms = _time_each(call, count, settings["runs"], sleep, device=device)
    return {"time_ms": time_ms, "device_ms": device_ms, "host_ms": host_ms, "calls": calls}


class InputSets:
    """Several sets of (q, k, v, dO) for a point, rotated so the whole exceeds L2."""

    def __init__(self, point, l2_bytes, device="cuda", max_sets=8):
        import torch
        self.point = point
        self.device = device
        dtype = _torch_dtype(point.dtype)
        set_bytes = bytes_moved(point, "fwd") + bytes_moved(point, "fwd") // 4
        count = min(max_sets, max(1, math.ceil(4 * l2_bytes / max(1, set_bytes))))
        generator = torch.Generator(device=device).manual_seed(0)

        def randn(shape):
            return torch.randn(shape, generator=generator, device=device, dtype=dtype)

        self.sets = []
        p = point
        for _ in range(count):
            if p.varlen:
                tokens = sum(p.lens)
                q = randn((tokens, p.heads_q, p.head_dim))
                k = randn((tokens, p.heads_kv, p.head_dim))
                v = randn((tokens, p.heads_kv, p.head_dim))
            else:
                q = randn((p.batch, p.seqlen_q, p.heads_q, p.head_dim))
                k = randn((p.batch, p.seqlen_kv, p.heads_kv, p.head_dim))
                v = randn((p.batch, p.seqlen_kv, p.heads_kv, p.head_dim))
            self.sets.append({"q": q, "k": k, "v": v, "do": randn(q.shape)})
        if p.varlen:
            cu = [0]
            for n in p.lens:
                cu.append(cu[-1] + n)
            self.cu_seqlens = torch.tensor(cu, dtype=torch.int32, device=device)
            self.document = torch.repeat_interleave(
                torch.arange(len(p.lens), device=device), torch.tensor(p.lens, device=device))


def _sdpa_mask(point):
    """(attn_mask, is_causal) for torch SDPA in the header's alignment."""
    if point.mask == "causal":
        return None, True
    if point.mask == "causal_bottom_right":
        from torch.nn.attention.bias import causal_lower_right
        return causal_lower_right(point.seqlen_q, point.seqlen_kv), False
    return None, False


def _chosen(explain_line):
    """'forward: cudnn [plans: ...]; not chosen: ...' -> 'cudnn': the backend's name alone
    (the diagnostic may add a note in brackets after it)."""
    chosen = explain_line.split(":", 1)[1].split(";")[0].strip()
    return chosen.split(" ", 1)[0].split("[", 1)[0]


def make_forward(impl, point, inputs):
    """fn(set) -> output tensor, for one implementation; raises Unsupported."""
    import torch
    p = point
    gqa = p.heads_q != p.heads_kv
    if is_ours(impl):
        import fusedattn
        backend = impl.split(":", 1)[1]
        available = fusedattn.backends()
        if backend != "auto" and available.get(backend) != "available":
            raise Unsupported("not available: %s" % available.get(backend))
        mask = "causal_bottom_right" if p.mask == "causal_bottom_right" else (
            "causal" if p.causal else None)
        if p.varlen:
            kwargs = dict(layout="thd", cu_seqlens_q=inputs.cu_seqlens,
                          cu_seqlens_kv=inputs.cu_seqlens, max_seqlen_q=max(p.lens),
                          max_seqlen_kv=max(p.lens))
        else:
            kwargs = dict(layout="bshd")
        s0 = inputs.sets[0]
        try:
            explanation = fusedattn.explain(s0["q"], s0["k"], s0["v"], mask=mask,
                                            backend=backend, **kwargs)
        except fusedattn.Error as error:
            raise Unsupported(str(error))
        if "cannot run" in explanation or "no backend runs" in explanation:
            raise Unsupported(explanation.replace("\n", "; "))

        def forward(s):
            return fusedattn.attention(s["q"], s["k"], s["v"], mask=mask, backend=backend,
                                       **kwargs)
        # The backend auto (or the forced one) picks, for the forward and for training.
        lines = explanation.splitlines()
        forward.backends = {"fwd": _chosen(lines[0]), "train": _chosen(lines[1])}
        return forward
    if impl.startswith("torch:") and impl != "torch:varlen":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "math": SDPBackend.MATH}[impl.split(":")[1]]
        attn_mask, is_causal = _sdpa_mask(p)
        F = torch.nn.functional

        def forward(s):
            o = F.scaled_dot_product_attention(
                s["q"].transpose(1, 2), s["k"].transpose(1, 2), s["v"].transpose(1, 2),
                attn_mask=attn_mask, is_causal=is_causal, enable_gqa=gqa)
            return o.transpose(1, 2)
        # The backend is chosen once around the whole measurement, as a program sets it once:
        # entering sdpa_kernel per call would add its own host cost to every SDPA call.
        forward.context = lambda: sdpa_kernel([backend])
        return forward
    if impl == "torch:varlen":
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            raise Unsupported("torch.nn.attention.varlen is not in this torch")
        import inspect
        params = inspect.signature(varlen_attn).parameters
        kwargs = {}
        if p.causal:
            if "is_causal" in params:
                kwargs["is_causal"] = True
            elif "window_size" in params:
                kwargs["window_size"] = (-1, 0)
            else:
                raise Unsupported("varlen_attn takes no causal argument")
        if gqa:
            raise Unsupported("GQA")
        cu, n = inputs.cu_seqlens, max(p.lens)

        def forward(s):
            return varlen_attn(s["q"], s["k"], s["v"], cu, cu, n, n, **kwargs)
        return forward
    if impl == FA4:
        return _fa4_forward(p, inputs)
    if impl == "flex":
        return _flex_forward(p, inputs)
    raise ValueError("unknown implementation %s" % impl)


def import_fa4():
    """(flash_attn_func, flash_attn_varlen_func) of FlashAttention-4, or Unsupported with the
    reason when flash_attn.cute is not importable (not installed: on the GPU machine,
    scripts/gpu_run.sh's fa4_stash and fa4_install steps install it). Any error counts: a
    missing compiled library of the CuTe DSL raises OSError rather than ImportError."""
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    except Exception as error:
        raise Unsupported("FlashAttention-4 (flash_attn.cute) is not importable: %s: %s" % (
            type(error).__name__, " ".join(str(error).split())[:200]))
    return flash_attn_func, flash_attn_varlen_func


def fa4_version():
    """The installed flash-attn-4 version, or why it is not there (for the device header)."""
    try:
        import_fa4()
    except Unsupported as reason:
        return "not importable (%s)" % reason
    from importlib import metadata
    try:
        return metadata.version("flash-attn-4")
    except metadata.PackageNotFoundError:
        return "importable, version unknown"


def _fa4_forward(p, inputs):
    """FlashAttention-4 on the point's tensors as they are (BSHD, or THD with cu_seqlens; GQA
    natively). Its causal mask is aligned to the bottom right (the last query sees every key),
    which is our causal_bottom_right, and our top-left causal where sq == skv."""
    # Importable first: a dry run on the CPU then takes the path of a GPU machine without FA4.
    flash_attn_func, flash_attn_varlen_func = import_fa4()
    if inputs.device != "cuda":
        raise Unsupported("FlashAttention-4 runs on CUDA only")
    if p.mask == "causal" and p.seqlen_q != p.seqlen_kv:
        raise Unsupported("FlashAttention-4's causal mask is bottom-right aligned; top-left "
                          "with sq != skv is not expressible")
    scale = 1.0 / math.sqrt(p.head_dim)

    def output(result):
        # flash_attn_func / flash_attn_varlen_func return (out, lse).
        return result[0] if isinstance(result, tuple) else result
    if p.varlen:
        cu, n = inputs.cu_seqlens, max(p.lens)

        def forward(s):
            return output(flash_attn_varlen_func(
                s["q"], s["k"], s["v"], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n,
                max_seqlen_k=n, softmax_scale=scale, causal=p.causal))
        return forward

    def forward(s):
        return output(flash_attn_func(s["q"], s["k"], s["v"], softmax_scale=scale,
                                      causal=p.causal))
    return forward


_FLEX = {}


def _flex_forward(p, inputs):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if "compiled" not in _FLEX:
        _FLEX["compiled"] = torch.compile(flex_attention, dynamic=False)
    compiled = _FLEX["compiled"]
    gqa = p.heads_q != p.heads_kv
    if p.varlen:
        document = inputs.document

        def mask_mod(b, h, q_idx, kv_idx):
            same = document[q_idx] == document[kv_idx]
            return same & (q_idx >= kv_idx) if p.causal else same
        tokens = sum(p.lens)
        block_mask = create_block_mask(mask_mod, None, None, tokens, tokens,
                                       device=inputs.device)

        def forward(s):
            o = compiled(s["q"].transpose(0, 1).unsqueeze(0), s["k"].transpose(0, 1).unsqueeze(0),
                         s["v"].transpose(0, 1).unsqueeze(0), block_mask=block_mask,
                         enable_gqa=gqa)
            return o.squeeze(0).transpose(0, 1)
        return forward
    block_mask = None
    if p.causal:
        shift = p.seqlen_kv - p.seqlen_q if p.mask == "causal_bottom_right" else 0

        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx + shift >= kv_idx
        block_mask = create_block_mask(mask_mod, None, None, p.seqlen_q, p.seqlen_kv,
                                       device=inputs.device)

    def forward(s):
        o = compiled(s["q"].transpose(1, 2), s["k"].transpose(1, 2), s["v"].transpose(1, 2),
                     block_mask=block_mask, enable_gqa=gqa)
        return o.transpose(1, 2)
    return forward


def make_call(forward, direction, sets):
    """call(i) -> one call of the direction on input set i. fwd and fwd-train call the forward
    (the caller sets the grad mode: fwd runs under torch.no_grad); fwd-train's inputs require
    grad, so the autograd graph is recorded; bwd runs autograd.grad on a graph kept from one
    forward per set; fwd+bwd is the forward, then autograd.grad."""
    import torch
    if direction == "fwd":
        return lambda i: forward(sets[i])
    leaves = [{"q": s["q"].detach().requires_grad_(), "k": s["k"].detach().requires_grad_(),
               "v": s["v"].detach().requires_grad_(), "do": s["do"]} for s in sets]
    if direction == "fwd-train":
        return lambda i: forward(leaves[i])
    if direction == "bwd":
        outputs = [forward(s) for s in leaves]

        def backward(i):
            s = leaves[i]
            return torch.autograd.grad(outputs[i], (s["q"], s["k"], s["v"]), s["do"],
                                       retain_graph=True)
        return backward
    if direction == "fwd+bwd":
        def forward_backward(i):
            s = leaves[i]
            o = forward(s)
            return torch.autograd.grad(o, (s["q"], s["k"], s["v"]), s["do"])
        return forward_backward
    raise ValueError("unknown direction %s" % direction)


def measure(task, settings, state):
    """Times one (point, implementation, direction) both ways; returns the result dict."""
    import torch
    point = Point.from_dict(task["point"])
    device = settings.get("device", "cuda")
    if state.get("point_key") != point.key:
        state.pop("inputs", None)
        if device == "cuda":
            torch.cuda.empty_cache()
        state["inputs"] = InputSets(point, state.get("l2_bytes", 50 * 2**20), device)
        state["point_key"] = point.key
    inputs = state["inputs"]
    forward = make_forward(task["impl"], point, inputs)
    direction = task["direction"]
    result = {}
    if getattr(forward, "backends", None):
        result["backend"] = forward.backends["fwd" if direction == "fwd" else "train"]
    call = make_call(forward, direction, inputs.sets)
    # The inference forward runs under no_grad (as a server's step does); the others record
    # the autograd graph.
    context = getattr(forward, "context", contextlib.nullcontext)
    with torch.set_grad_enabled(direction != "fwd"), context():
        result.update(time_both_ways(call, len(inputs.sets), settings, state, device))
    result["status"] = "ok"
    return result


def _sticky_cuda_error(error):
    text = str(error).lower()
    return any(s in text for s in ("illegal memory access", "unspecified launch failure",
                                   "device-side assert", "misaligned address",
                                   "illegal instruction", "cuda error: an illegal"))


def classify_error(error):
    """(status, message) of an exception raised by a measurement: "unsupported" when the
    implementation refuses the problem (PyTorch SDPA's "No available kernel", fusedattn's
    NotSupportedError), "crashed" when the CUDA context is unusable after it, else "failed"
    (out of memory included: the tables show OOM). An assertion or NotImplementedError that
    speaks of support (FlashAttention-4's way of refusing a problem) is "unsupported" too."""
    text = "%s: %s" % (type(error).__name__, error)
    if isinstance(error, Unsupported):
        return "unsupported", str(error)
    if any(s in str(error) for s in ("No available kernel", "No viable backend")) or \
            type(error).__name__ == "NotSupportedError":
        return "unsupported", text
    # FlashAttention-4 states its limits as assertions ("... is not supported on SM90").
    if isinstance(error, (AssertionError, NotImplementedError)) and \
            "support" in str(error).lower():
        return "unsupported", text
    if _sticky_cuda_error(error):
        return "crashed", text
    return "failed", text


def worker_main(task_file):
    """Runs tasks from task_file, printing BEGIN <id> and RESULT <json> lines. Exits (code 3)
    after a CUDA error that leaves the context unusable; the driver starts a new worker."""
    with open(task_file) as f:
        job = json.load(f)
    settings = job["settings"]
    device = settings.get("device", "cuda")
    state = {}
    import torch
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        state["l2_bytes"] = getattr(props, "L2_cache_size", 50 * 2**20)
    for task in job["tasks"]:
        print("BEGIN %d" % task["id"], flush=True)
        started = time.time()
        try:
            if task["kind"] == "device":
                result = measure_device(settings)
                result["status"] = "ok"
            else:
                result = measure(task, settings, state)
        except Exception as error:  # recorded; the run goes on
            status, message = classify_error(error)
            result = {"status": status, "error": message}
            # Drop this point's inputs (and whatever the failure left) before the next task.
            state.pop("inputs", None)
            state.pop("point_key", None)
            if device == "cuda" and status != "crashed":
                torch.cuda.empty_cache()
        result["id"] = task["id"]
        result["seconds"] = round(time.time() - started, 2)
        print("RESULT " + json.dumps(result, default=str), flush=True)
        if result["status"] == "crashed":
            sys.exit(3)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def build_rows(points, tasks, results, device):
    rows = []
    by_point = {}
    for task in tasks:
        if task["kind"] != "measure":
            continue
        key = (Point.from_dict(task["point"]).key, task["direction"])
        by_point.setdefault(key, {})[task["impl"]] = results.get(
            task["id"], {"status": "failed", "error": "no result"})
    for point in points:
        for direction in point.directions:
            rows.append(analyze(point, direction, by_point.get((point.key, direction), {}),
                                device))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", choices=sorted(GRIDS) + sorted(EXTRA_GRIDS) + ["all"],
                        default="prefill")
    parser.add_argument("--quick", action="store_true", help="a few points (about 2 minutes)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (bench/results)")
    parser.add_argument("--only", default=None,
                        help="comma-separated implementations to run (e.g. fusedattn:auto,flex)")
    parser.add_argument("--filter", default=None,
                        help="a regular expression: only the points whose label matches "
                             "(e.g. 'bf16 d128' or 'causal$'), to split a long grid")
    parser.add_argument("--rounds", type=int, default=None,
                        help="time every task this many times, implementations rotated each "
                             "round, and keep the median (for ratios near a bound); default 1, "
                             "%d on the host grid" % HOST_ROUNDS)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a dry run of the harness on CPU tensors (with --grid smoke)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.worker)
        return 0
    grids = sorted(GRIDS) if args.grid == "all" else [args.grid]
    points = [p for g in grids for p in dict(GRIDS, **EXTRA_GRIDS)[g](args.quick)]
    if args.filter:
        points = [p for p in points if re.search(args.filter, p.label)]
        grids = [g for g in grids if any(p.grid == g for p in points)]
    if not points:
        parser.error("no point left to run")
    host = args.grid == "host"
    rounds = args.rounds or (HOST_ROUNDS if host else 1)
    tasks = make_tasks(points, args.quick, rounds)
    if args.only:
        wanted = set(args.only.split(","))
        tasks = [t for t in tasks if t["kind"] == "device" or t["impl"] in wanted]
    started = time.time()
    settings = dict(settings_for(args.quick, host, args.device), device=args.device)
    results = run_tasks(tasks, worker_command_for(os.path.abspath(__file__)), settings)
    device = results.get(0, {})
    if device.get("status") != "ok":
        print("device measurement failed: %s" % device.get("error"), file=sys.stderr)
        device = {"name": "unknown-device", "date": datetime.date.today().isoformat()}
    os.makedirs(args.out, exist_ok=True)
    # One set of files: <grid>-<device>-<date>, or all-<device>-<date> with a section per grid.
    sections = []
    row_tasks, row_results = merge_rounds(tasks, results)
    for grid in grids:
        grid_points = [p for p in points if p.grid == grid]
        rows = build_rows(grid_points, row_tasks, row_results, device)
        sections.append((grid, rows, grid_points[0].unit if grid_points else "tflops"))
    paths = output_paths(args.out, args.grid, device.get("name", "device"),
                         device.get("date", datetime.date.today().isoformat()))
    raw = [dict(task, result=results.get(task["id"])) for task in tasks]
    write_markdown(paths["md"], sections, device)
    write_json(paths["json"], sections, device, points, raw)
    written = [paths["md"], paths["json"]]
    try:
        if write_plot(paths["png"], sections):
            written.append(paths["png"])
    except Exception as error:  # matplotlib missing: the tables still stand
        print("plot not written: %s" % error, file=sys.stderr)
    print("wrote %s" % ", ".join(written))
    print("done in %.0f s" % (time.time() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
