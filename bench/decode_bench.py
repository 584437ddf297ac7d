#!/usr/bin/env python3
"""Decode against a KV cache, paged and contiguous (issue 21's "Done when" grid): fusedattn flash
(its decode kernel), fusedattn cuDNN, PyTorch's cuDNN SDPA and FlashAttention-4
(`flash_attn.cute`, with its page table where the point is paged), side by side in one process.

    python bench/decode_bench.py [--quick] [--budget-s 270] [--filter TEXT] [--out DIR]

Grid: sq 1 and 4 (sq 4 with a bottom-right causal mask: speculative decode), GQA 32/8 and 64/8,
d 128 and 64, bf16, b in {1, 8, 64, 256}, skv in {512, 4096, 32768, 131072} where the cache
fits (K + V <= 24 GiB), page sizes 16 and 64 and contiguous K/V. Every sequence has skv keys;
paged points take their pages from a shuffled pool, as a serving engine's cache looks after a
while. --quick: the issue's table (sq 1, GQA 32/8, d128) and a few paged points.

Timing: for each (point, implementation), back to back: after 3 warm-up calls, N calls issued
one after another between two CUDA events (N such that a loop takes >= 20 ms, at least 10),
the median of 3 loops; host cost counts where it exceeds the GPU's. Input sets (q, K/V caches,
page tables) are rotated so that together they exceed 4x the L2 cache. Rates: GB/s over the
bytes of K and V a call reads (each sequence's skv keys, every kv head) plus q and o, and that
as a fraction of the copy bandwidth measured first (a 2 GiB device-to-device copy, bytes read +
written). "ours / best" is fusedattn flash's rate over the best of the others.

Writes <out>/decode-<device>-<date>.md and .json; prints each row as it is measured (and the
files are rewritten after each point, so a run cut short by --budget-s or a time limit keeps
what it measured).
"""

import argparse
import datetime
import inspect
import json
import math
import os
import random
import statistics
import sys
import time

GIB = 1 << 30


def grid(quick=False):
    """(sq, heads_q, heads_kv, d, batch, skv, page_size) points; page_size 0: contiguous."""
    points = []
    if quick:
        for b, skv in ((64, 1024), (64, 8192), (16, 32768), (128, 512), (1, 131072)):
            for page in (0, 16, 64):
                points.append((1, 32, 8, 128, b, skv, page))
        return points
    for sq in (1, 4):
        for d in (128, 64):
            for hq, hkv in ((32, 8), (64, 8)):
                for b in (1, 8, 64, 256):
                    for skv in (512, 4096, 32768, 131072):
                        if 2 * b * skv * hkv * d * 2 > 24 * GIB:
                            continue
                        for page in (16, 64, 0):
                            points.append((sq, hq, hkv, d, b, skv, page))
    return points


def label(point):
    sq, hq, hkv, d, b, skv, page = point
    cache = "contiguous" if page == 0 else "page%d" % page
    return "bf16 d%d h%d/%d b%d sq%d skv%d %s" % (d, hq, hkv, b, sq, skv, cache)


def kv_bytes(point):
    sq, hq, hkv, d, b, skv, page = point
    return 2 * b * skv * hkv * d * 2


def bytes_read(point):
    sq, hq, hkv, d, b, skv, page = point
    return kv_bytes(point) + 2 * b * sq * hq * d * 2  # K, V; q and o


def measure_copy_bandwidth(torch):
    n = 2 * GIB // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    del src, dst
    return 2 * 2 * GIB / statistics.median(times)


class Inputs:
    """Rotated sets of q, the cache (contiguous [b, skv, hkv, d] or pools [pages, page, hkv, d])
    and its page table."""

    def __init__(self, torch, point, l2_bytes):
        sq, hq, hkv, d, b, skv, page = point
        per_set = bytes_read(point)
        count = max(1, min(8, math.ceil(4 * l2_bytes / per_set)))
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.sets = []
        for k in range(count):
            q = torch.randn((b, sq, hq, d), generator=gen, device="cuda", dtype=torch.bfloat16)
            s = {"q": q}
            if page == 0:
                s["k"] = torch.randn((b, skv, hkv, d), generator=gen, device="cuda",
                                     dtype=torch.bfloat16)
                s["v"] = torch.randn_like(s["k"])
            else:
                per_seq = (skv + page - 1) // page
                pages = b * per_seq
                s["k"] = torch.randn((pages, page, hkv, d), generator=gen, device="cuda",
                                     dtype=torch.bfloat16)
                s["v"] = torch.randn_like(s["k"])
                order = list(range(pages))
                random.Random(k).shuffle(order)
                s["page_table"] = torch.tensor(order, dtype=torch.int32,
                                               device="cuda").reshape(b, per_seq)
            s["seqlens"] = torch.full((b,), skv, dtype=torch.int32, device="cuda")
            self.sets.append(s)


class Unsupported(Exception):
    pass


def make_call(impl, point, inputs, torch):
    sq, hq, hkv, d, b, skv, page = point
    causal = sq > 1  # bottom-right: the last query sees every key
    if impl.startswith("fusedattn:"):
        import fusedattn
        backend = impl.split(":")[1]
        mask = "causal_bottom_right" if causal else None
        extra = {}
        if page:
            extra = dict(max_seqlen_kv=skv)
        s0 = inputs.sets[0]
        paged = dict(page_table=s0["page_table"], seqlens_kv=s0["seqlens"]) if page else {}
        try:
            text = fusedattn.explain(s0["q"], s0["k"], s0["v"], mask=mask, backend=backend,
                                     layout="bshd", **extra, **paged)
        except fusedattn.Error as error:
            raise Unsupported(" ".join(str(error).split())[:160])
        first = text.splitlines()[0] if text else ""  # the forward's line
        if "cannot run" in first or "no backend runs" in first:
            raise Unsupported(" ".join(first.split())[:160])

        def call(s):
            paged = dict(page_table=s["page_table"], seqlens_kv=s["seqlens"]) if page else {}
            return fusedattn.attention(s["q"], s["k"], s["v"], mask=mask, backend=backend,
                                       layout="bshd", **extra, **paged)
        return call
    if impl == "torch:cudnn":
        if page:
            raise Unsupported("SDPA takes no page table")
        from torch.nn.attention import SDPBackend, sdpa_kernel
        mask = None
        if causal:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(sq, skv)
        F = torch.nn.functional

        def call(s):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                o = F.scaled_dot_product_attention(
                    s["q"].transpose(1, 2), s["k"].transpose(1, 2), s["v"].transpose(1, 2),
                    attn_mask=mask, enable_gqa=hq != hkv)
            return o.transpose(1, 2)
        return call
    if impl == "fa4":
        try:
            from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
        except Exception as error:
            raise Unsupported("flash_attn.cute not importable: %s" % type(error).__name__)
        scale = 1.0 / math.sqrt(d)
        if page:
            params = inspect.signature(flash_attn_varlen_func).parameters
            if "page_table" not in params:
                raise Unsupported("this flash_attn.cute has no page_table")
            kw = {"num_splits": 0} if "num_splits" in params else {}

            def call(s):
                r = flash_attn_varlen_func(s["q"], s["k"], s["v"], seqused_k=s["seqlens"],
                                           page_table=s["page_table"], max_seqlen_q=sq,
                                           max_seqlen_k=skv, softmax_scale=scale, causal=causal,
                                           **kw)
                return r[0] if isinstance(r, tuple) else r
            return call
        params = inspect.signature(flash_attn_func).parameters
        kw = {"num_splits": 0} if "num_splits" in params else {}

        def call(s):
            r = flash_attn_func(s["q"], s["k"], s["v"], softmax_scale=scale, causal=causal, **kw)
            return r[0] if isinstance(r, tuple) else r
        return call
    raise ValueError(impl)


def time_back_to_back(call, sets, torch):
    for k in range(3):
        call(sets[k % len(sets)])
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call(sets[0])
    stop.record()
    stop.synchronize()
    one = max(start.elapsed_time(stop), 1e-3)
    n = max(10, int(20.0 / one))
    loops = []
    for _ in range(3):
        start.record()
        for k in range(n):
            call(sets[k % len(sets)])
        stop.record()
        stop.synchronize()
        loops.append(start.elapsed_time(stop) / n)
    return statistics.median(loops)  # ms per call


IMPLS = ("fusedattn:flash", "fusedattn:cudnn", "torch:cudnn", "fa4")


def write(out_dir, device, copy_bw, rows, partial):
    date = datetime.date.today().isoformat()
    slug = "".join(c if c.isalnum() else "-" for c in device.lower()).strip("-")
    base = os.path.join(out_dir, "decode-%s-%s" % (slug, date))
    with open(base + ".json", "w") as f:
        json.dump({"device": device, "copy_bytes_per_s": copy_bw, "rows": rows,
                   "partial": partial}, f, indent=1)
    lines = ["# Decode against a KV cache (bench/decode_bench.py)", "",
             "%s; copy bandwidth %.0f GB/s (read + written). GB/s over the K/V, q and o bytes "
             "of a call, back to back; (x%%) of the copy bandwidth. ours / best: fusedattn "
             "flash over the best other.%s" % (device, copy_bw / 1e9,
                                               " PARTIAL (time budget)." if partial else ""),
             "", "| point | KV MB | " + " | ".join(IMPLS) + " | ours / best |",
             "|---|---|" + "---|" * len(IMPLS) + "---|"]
    for row in rows:
        cells = []
        for impl in IMPLS:
            r = row["results"].get(impl, {})
            if "gbps" in r:
                cells.append("%.0f (%.0f%%)" % (r["gbps"], 100 * r["gbps"] * 1e9 / copy_bw))
            else:
                cells.append("n/a")
        ratio = row.get("ours_over_best")
        lines.append("| %s | %.0f | %s | %s |" % (
            row["label"], row["kv_bytes"] / 1e6, " | ".join(cells),
            "%.2f" % ratio if ratio else "-"))
    notes = sorted({"%s: %s" % (impl, r["error"]) for row in rows
                    for impl, r in row["results"].items() if "error" in r})
    if notes:
        lines += ["", "Not measured:"] + ["* " + n for n in notes[:40]]
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    return base


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="stop starting new points after this many seconds")
    parser.add_argument("--filter", default="", help="only points whose label contains this")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    import torch
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    device = props.name
    l2 = getattr(props, "L2_cache_size", 50 * 1024 * 1024)
    copy_bw = measure_copy_bandwidth(torch)
    print("%s: copy bandwidth %.0f GB/s" % (device, copy_bw / 1e9), flush=True)
    rows = []
    points = [p for p in grid(args.quick) if args.filter in label(p)]
    partial = False
    for point in points:
        if time.time() - t0 > args.budget_s:
            partial = True
            print("time budget spent: %d of %d points measured" % (len(rows), len(points)))
            break
        row = {"label": label(point), "point": list(point), "kv_bytes": kv_bytes(point),
               "results": {}}
        try:
            inputs = Inputs(torch, point, l2)
        except torch.cuda.OutOfMemoryError:
            row["results"] = {impl: {"error": "out of memory (inputs)"} for impl in IMPLS}
            rows.append(row)
            torch.cuda.empty_cache()
            continue
        for impl in IMPLS:
            try:
                call = make_call(impl, point, inputs, torch)
                ms = time_back_to_back(call, inputs.sets, torch)
                row["results"][impl] = {"ms": ms, "gbps": bytes_read(point) / (ms / 1e3) / 1e9}
            except Unsupported as reason:
                row["results"][impl] = {"error": str(reason)}
            except Exception as error:  # a peer's failure is recorded, not fatal
                row["results"][impl] = {"error": "%s: %s" % (
                    type(error).__name__, " ".join(str(error).split())[:160])}
                torch.cuda.synchronize()
        del inputs
        torch.cuda.empty_cache()
        ours = row["results"].get("fusedattn:flash", {}).get("gbps")
        others = [r["gbps"] for impl, r in row["results"].items()
                  if impl != "fusedattn:flash" and "gbps" in r]
        if ours and others:
            row["ours_over_best"] = ours / max(others)
        rows.append(row)
        print("%-48s %s" % (row["label"], "  ".join(
            "%s=%s" % (impl.split(":")[-1] if impl != "torch:cudnn" else "sdpa-cudnn",
                       "%.0f" % r["gbps"] if "gbps" in r else "n/a")
            for impl, r in row["results"].items())), flush=True)
        write(args.out, device, copy_bw, rows, partial)
    base = write(args.out, device, copy_bw, rows, partial)
    print("wrote %s.md and .json (%.0f s)" % (base, time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
