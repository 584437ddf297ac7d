#!/usr/bin/env python3
"""fusedattn.jax against jax.nn.dot_product_attention (implementation "cudnn", and "xla" where
its score matrix fits), on the same JAX arrays, in one process; with a correctness check first.

    python bench/jax_bench.py --grid headline|prefill|small_seq|all [--filter TEXT] [--out DIR]
    python bench/jax_bench.py --grid smoke --platform cpu --quick    # a dry run of the harness

writes <out>/jax-<grid>-<device>-<date>.{md,json} (default out: bench/results).

Grids (bf16, q [b, s, h, d] as jax.nn takes it):
* headline: b 1, h 16, d 128, s 16384, causal and not: the anchor of issue 20 (jax.nn cudnn
  measured 647 TFLOP/s forward and 582 forward+backward there, 607 / 552 causal).
* prefill: d 64 / 128, s 1024..16384 at 16k tokens, h = 2048 / d, causal and not, and GQA
  (h 16 / 4 at d 128).
* small_seq: sq 1, skv 2..16, b 30720, h 8, d 128 (the seed's cross-attention shape): TB/s.
Directions: fwd (the forward alone, jitted) and fwd+bwd (jax.value_and_grad of sum(o * dO) with
respect to q, k, v, one jitted call).

Timing, both ways for every (point, implementation, direction), after warm-up calls that also
compile:
* back to back (the headline): N calls of the jitted function issued one after another from
  Python with input sets rotated, jax.block_until_ready on the last result only; time per call
  = wall time / N (host cost included where it exceeds the GPU's); N for a loop of ~0.2 s (at
  least 10 calls), the median of 3 loops.
* device only: one jitted call that runs the operation R times in a jax.lax.fori_loop (each
  iteration's input depends on the sum of the previous one's outputs, so nothing is hoisted or
  dropped; the sums cost both implementations the same); time per operation =
  (T(R) - T(1)) / (R - 1), which removes the fixed dispatch cost; the median of 3.
FLOPs and bytes as bench/bench.py counts them (4 b h d pairs, x3.5 forward+backward; q, k, v, o,
lse once, and dO, dQ, dK, dV for the backward).

--check (on by default; --no-check skips it), before timing: (1) fusedattn.jax on the GPU against
the CPU reference backend (float64 inside) on a reduced copy of each point (s and skv capped at
512, b at 2), forward and gradients; (2) at the full shape, fusedattn.jax against jax.nn's
cuDNN (forward); ||a - b|| / ||b|| must stay under 1e-2 (bf16) for both.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (the pure helpers: Point, flops, bytes_moved, three_digits, names)
from bench import Point  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results")
DIRECTIONS = ("fwd", "fwd+bwd")
IMPLS = ("fusedattn.jax", "jax.nn:cudnn", "jax.nn:xla")
OURS = "fusedattn.jax"
# jax.nn's xla implementation materializes float32 scores [b, h, sq, skv]: left out above this.
XLA_SCORE_BYTES = 4 << 30
TOLERANCE = 1e-2  # bf16, DESIGN.md


# ---------------------------------------------------------------------------------------------
# Grids
# ---------------------------------------------------------------------------------------------

def headline_grid():
    return [Point("headline", "bf16", 1, 16, 16, 16384, 16384, 128, mask,
                  directions=DIRECTIONS) for mask in ("none", "causal")]


def prefill_grid():
    points = []
    for d in (64, 128):
        for s in (1024, 2048, 4096, 8192, 16384):
            for mask in ("none", "causal"):
                h = 2048 // d
                points.append(Point("prefill", "bf16", 16384 // s, h, h, s, s, d, mask,
                                    directions=DIRECTIONS))
                if d == 128:  # GQA
                    points.append(Point("prefill", "bf16", 16384 // s, 16, 4, s, s, d, mask,
                                        directions=DIRECTIONS))
    return points


def small_seq_grid():
    return [Point("small_seq", "bf16", 30720, 8, 8, 1, skv, 128, "none", directions=DIRECTIONS,
                  unit="tbps") for skv in (2, 4, 8, 16)]


def smoke_grid():
    """Tiny points for a dry run of the harness on the CPU; their figures mean nothing."""
    return [Point("smoke", "bf16", 2, 4, 2, 64, 64, 32, "causal", directions=DIRECTIONS),
            Point("smoke", "bf16", 64, 4, 4, 1, 8, 64, "none", directions=DIRECTIONS,
                  unit="tbps")]


GRIDS = {"headline": headline_grid, "prefill": prefill_grid, "small_seq": small_seq_grid,
         "smoke": smoke_grid}


# ---------------------------------------------------------------------------------------------
# The calls
# ---------------------------------------------------------------------------------------------

def make_inputs(jax, jnp, point, device, sets, seed=0):
    """`sets` input sets (q, k, v, dO) on device."""
    key = jax.random.key(seed)
    shapes = ((point.batch, point.seqlen_q, point.heads_q, point.head_dim),
              (point.batch, point.seqlen_kv, point.heads_kv, point.head_dim),
              (point.batch, point.seqlen_kv, point.heads_kv, point.head_dim),
              (point.batch, point.seqlen_q, point.heads_q, point.head_dim))
    out = []
    for _ in range(sets):
        arrays = []
        for shape in shapes:
            key, sub = jax.random.split(key)
            arrays.append(jax.device_put(jax.random.normal(sub, shape, jnp.bfloat16), device))
        out.append(tuple(arrays))
    return out


def attention_of(impl, point):
    """f(q, k, v) -> o for an implementation; None when it does not run the point (with why)."""
    import jax
    import fusedattn.jax as fj
    causal = point.mask != "none"
    if impl == OURS:
        return lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=causal), None
    implementation = impl.split(":")[1]
    if implementation == "xla":
        scores = 4 * point.batch * point.heads_q * point.seqlen_q * point.seqlen_kv
        if scores > XLA_SCORE_BYTES:
            return None, "materializes %.1f GB of float32 scores" % (scores / 1e9)
    return (lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                         implementation=implementation)), None


def step_of(attend, direction):
    """(q, k, v, dO) -> outputs of one operation of the direction."""
    import jax
    import jax.numpy as jnp
    if direction == "fwd":
        return lambda q, k, v, d_o: attend(q, k, v)

    def loss(q, k, v, d_o):
        return jnp.sum(attend(q, k, v).astype(jnp.float32) * d_o.astype(jnp.float32))

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


def repeated(step, repeats):
    """One jitted call running step `repeats` times. Each iteration's q depends on the sum of
    every output of the previous one (q + 1 where that sum is NaN, which it never is), so XLA
    can neither drop an operation nor hoist it out of the loop (an optimization barrier alone
    did not stop XLA from removing the whole loop body). The sums read each output once more:
    a few percent of a small_seq call, for every implementation alike."""
    import jax
    import jax.numpy as jnp

    def run(q, k, v, d_o):
        def body(_, q):
            total = sum(jnp.sum(x.astype(jnp.float32))
                        for x in jax.tree.leaves(step(q, k, v, d_o)))
            return jnp.where(jnp.isnan(total), q + 1, q)
        return jax.lax.fori_loop(0, repeats, body, q)

    return jax.jit(run)


# How long the timing loops run: --quick (a dry run) shortens them.
TIMING = dict(target_s=0.2, loops=3, least=10, runs=3)


def time_back_to_back(call, sets, target_s, loops, least):
    import jax
    jax.block_until_ready(call(*sets[0]))
    start = time.perf_counter()
    jax.block_until_ready(call(*sets[1 % len(sets)]))
    estimate = max(time.perf_counter() - start, 1e-6)
    count = max(least, int(target_s / estimate))
    times = []
    for _ in range(loops):
        start = time.perf_counter()
        out = None
        for i in range(count):
            out = call(*sets[i % len(sets)])
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / count)
    return statistics.median(times), count


def time_device(step, inputs, repeats, runs):
    import jax
    once, many = repeated(step, 1), repeated(step, repeats)
    for f in (once, many):
        jax.block_until_ready(f(*inputs))  # compile and warm up

    def wall(f):
        start = time.perf_counter()
        jax.block_until_ready(f(*inputs))
        return time.perf_counter() - start

    samples = [(wall(many) - wall(once)) / (repeats - 1) for _ in range(runs)]
    return max(statistics.median(samples), 1e-9)


def rates(point, direction, seconds):
    flops = bench.flops(point, direction)
    data = bench.bytes_moved(point, direction)
    return {"time_ms": seconds * 1e3, "tflops": flops / seconds / 1e12,
            "tbps": data / seconds / 1e12}


def measure(point, impl, direction, device, sets):
    attend, why = attention_of(impl, point)
    if attend is None:
        return {"status": "unsupported", "error": why}
    import jax
    step = step_of(attend, direction)
    try:
        call = jax.jit(step)
        back, count = time_back_to_back(call, sets, TIMING["target_s"], TIMING["loops"],
                                        TIMING["least"])
        repeats = max(3, min(50, int(TIMING["target_s"] / max(back, 1e-6))))
        device_s = time_device(step, sets[0], repeats, TIMING["runs"])
    except Exception as error:  # a failing implementation is recorded, the run goes on
        text = "%s: %s" % (type(error).__name__, error)
        lowered = text.lower()
        status = "unsupported" if any(w in lowered for w in (
            "not supported", "unsupported", "notimplemented", "not detected")) else "failed"
        return {"status": status, "error": text[:2000]}
    entry = dict(status="ok", calls=count, **rates(point, direction, back))
    entry["device"] = dict(repeats=repeats, **rates(point, direction, device_s))
    return entry


# ---------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------

def relative_error(a, b):
    import numpy as np
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    denominator = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / denominator) if denominator else float(np.linalg.norm(a))


def check(point, device, cpu):
    """Errors of fusedattn.jax on `device` against the CPU reference on a reduced copy of the
    point (forward and gradients), and against jax.nn's cuDNN at the full shape (forward)."""
    import dataclasses
    import jax
    import jax.numpy as jnp
    import fusedattn.jax as fj
    causal = point.mask != "none"
    small = dataclasses.replace(point, batch=min(point.batch, 2),
                                seqlen_q=min(point.seqlen_q, 512),
                                seqlen_kv=min(point.seqlen_kv, 512))
    q, k, v, d_o = make_inputs(jax, jnp, small, cpu, 1, seed=1)[0]

    def loss(q, k, v):
        o = fj.dot_product_attention(q, k, v, is_causal=causal)
        return jnp.sum(o.astype(jnp.float32) * d_o.astype(jnp.float32)), o

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))
    want_g, want_o = grad(q, k, v)  # CPU: the reference backend
    moved = [jax.device_put(x, device) for x in (q, k, v)]
    got_g, got_o = grad(*moved)
    errors = {"reference_o": relative_error(got_o, want_o)}
    for name, got, want in zip(("dq", "dk", "dv"), got_g, want_g):
        errors["reference_" + name] = relative_error(got, want)
    if device.platform == "gpu":
        q, k, v, _ = make_inputs(jax, jnp, point, device, 1, seed=2)[0]
        ours = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=causal))
        theirs = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation="cudnn"))
        try:
            errors["jax_nn_cudnn_o"] = relative_error(ours(q, k, v), theirs(q, k, v))
        except Exception as error:  # jax.nn's cuDNN may not run the point
            errors["jax_nn_cudnn_o_skipped"] = "%s: %s" % (type(error).__name__, error)
    return errors


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------

def cell(entry, unit, device=False):
    if entry["status"] != "ok":
        return "n/a" if entry["status"] == "unsupported" else "fail"
    figures = entry["device"] if device else entry
    return bench.three_digits(figures[unit])


def table(rows, device=False):
    header = ["point", "dir"] + list(IMPLS) + ["ours / jax.nn cudnn", "ours / best"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        unit = row["unit"]
        cells = [row["point"], row["direction"]]
        for impl in IMPLS:
            text = cell(row["impls"][impl], unit, device)
            if impl == OURS and row.get("backend"):
                text += " (%s)" % row["backend"]
            cells.append(text)
        ratios = row["device_ratios"] if device else row["ratios"]
        cells += ["%.2f" % r if r is not None else "-" for r in (ratios["cudnn"], ratios["best"])]
        lines.append("| " + " | ".join(cells) + " |")
    units = sorted({row["unit"] for row in rows})
    names = " or ".join("TFLOP/s" if u == "tflops" else "TB/s" for u in units)
    how = ("device only: R operations in one jitted fori_loop, (T(R) - T(1)) / (R - 1)" if device
           else "back to back: N jitted calls from Python, block_until_ready on the last")
    return "\n".join(lines) + "\n\nRates in %s, %s. n/a: not run (see the notes).\n" % (names,
                                                                                      how)


def ratios(impls, unit, device=False):
    def rate(impl):
        entry = impls[impl]
        if entry["status"] != "ok":
            return None
        return (entry["device"] if device else entry)[unit]
    ours = rate(OURS)
    others = [r for r in (rate(i) for i in IMPLS if i != OURS) if r]
    cudnn = rate("jax.nn:cudnn")
    return {"cudnn": ours / cudnn if ours and cudnn else None,
            "best": ours / max(others) if ours and others else None}


def write_outputs(paths, grid, rows, info, checks):
    lines = ["# fusedattn.jax against jax.nn.dot_product_attention: %s on %s" % (
        grid, info["device"]), "",
        "%s; jax %s, jaxlib %s, fusedattn %s (cuDNN %s); fusedattn backends: %s." % (
            info["date"], info["jax"], info["jaxlib"], info["fusedattn"],
            info["fusedattn_cudnn"], info["backends"]),
        "bench/jax_bench.py: every figure timed both ways in the same run (its header says "
        "how); FLOPs 4 b h d pairs (causal: half), x3.5 forward+backward (one jitted "
        "value_and_grad); TB/s from q, k, v, o, lse (and dO, dQ, dK, dV) moved once.", ""]
    if checks:
        lines += ["## Check", "", "||a - b|| / ||b||: fusedattn.jax on the GPU against the CPU "
                  "reference backend on a reduced copy of the point (b <= 2, s, skv <= 512), and "
                  "against jax.nn's cuDNN at the full shape; bound %g." % TOLERANCE, "",
                  "| point | " + " | ".join(sorted({k for c in checks.values() for k in c})) +
                  " |"]
        names = sorted({k for c in checks.values() for k in c})
        lines.append("|" + "---|" * (len(names) + 1))
        for label, errors in checks.items():
            lines.append("| %s | %s |" % (label, " | ".join(
                ("%.2e" % errors[n] if isinstance(errors.get(n), float) else
                 str(errors.get(n, "-"))[:60]) for n in names)))
        lines.append("")
    lines += ["## %s" % grid, "", "Back to back (the headline):", "", table(rows),
              "Device only:", "", table(rows, device=True)]
    notes = sorted({"- %s: %s" % (impl, " ".join(row["impls"][impl].get("error", "").split())[
        :300]) for row in rows for impl in IMPLS if row["impls"][impl]["status"] != "ok"})
    if notes:
        lines += ["Not run or failed:", ""] + notes + [""]
    with open(paths["md"], "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(paths["json"], "w") as f:
        json.dump({"grid": grid, "info": info, "checks": checks, "rows": rows}, f, indent=1,
                  default=str)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", default="headline", choices=list(GRIDS) + ["all"])
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--platform", default="gpu", choices=("gpu", "cpu"))
    parser.add_argument("--no-check", dest="check", action="store_false")
    parser.add_argument("--only", default="", help="comma-separated implementations")
    parser.add_argument("--filter", default="",
                        help="only the points whose label contains this text, e.g. 'd64'")
    parser.add_argument("--quick", action="store_true",
                        help="short timing loops (a dry run of the harness)")
    args = parser.parse_args(argv)
    if args.quick:
        TIMING.update(target_s=0.005, loops=1, least=2, runs=1)

    import jax
    import jaxlib
    import fusedattn
    import fusedattn.jax as fj

    device = jax.devices(args.platform)[0]
    cpu = jax.devices("cpu")[0]
    grids = ["headline", "prefill", "small_seq"] if args.grid == "all" else [args.grid]
    impls = [i for i in IMPLS if not args.only or i in args.only.split(",")]
    date = datetime.date.today().isoformat()
    info = {"device": device.device_kind if args.platform == "gpu" else "cpu", "date": date,
            "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "fusedattn": fusedattn.version(), "fusedattn_cudnn": fusedattn.cudnn_version(),
            "backends": ", ".join("%s: %s" % kv for kv in fusedattn.backends().items())}
    failed_checks = []
    for grid in grids:
        rows, checks = [], {}
        points = [p for p in GRIDS[grid]() if args.filter in p.label]
        os.makedirs(args.out, exist_ok=True)
        name = "jax-" + grid + ("-" + bench.device_slug(args.filter) if args.filter else "")
        paths = bench.output_paths(args.out, name, info["device"], date)
        for point in points:
            print("==", point.label, flush=True)
            if args.check:
                errors = check(point, device, cpu)
                checks[point.label] = errors
                bad = {n: e for n, e in errors.items() if isinstance(e, float) and
                       not e < TOLERANCE}
                print("   check:", json.dumps(errors), "FAILED" if bad else "ok", flush=True)
                if bad:
                    failed_checks.append((point.label, bad))
            sets = make_inputs(jax, jax.numpy, point, device, 2)
            explained = fj.explain(*sets[0][:3], layout="bshd",
                                   mask="causal" if point.mask != "none" else None)
            backend = explained.splitlines()[0].split(":")[1].split()[0].strip(" ,")
            for direction in point.directions:
                results = {impl: (measure(point, impl, direction, device, sets)
                                  if impl in impls else
                                  {"status": "unsupported", "error": "not asked for (--only)"})
                           for impl in IMPLS}
                row = {"point": point.label, "direction": direction, "unit": point.unit,
                       "backend": backend, "explain": explained, "impls": results,
                       "ratios": ratios(results, point.unit),
                       "device_ratios": ratios(results, point.unit, device=True)}
                rows.append(row)
                print("   %-7s %s" % (direction, "  ".join(
                    "%s %s/%s" % (impl, cell(results[impl], point.unit),
                                  cell(results[impl], point.unit, True)) for impl in IMPLS)),
                      flush=True)
            # After every point, so that a run cut off by its time limit keeps what it measured.
            write_outputs(paths, grid, rows, info, checks)
        print("wrote", paths["md"], paths["json"])
    if failed_checks:
        print("CHECK FAILED:", failed_checks)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
