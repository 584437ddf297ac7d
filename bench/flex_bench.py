#!/usr/bin/env python3
"""Score modifiers side by side: fusedattn.attention with a fusedattn.flex score_mod / mask_mod
(auto selection: the cuDNN backend) against compiled FlexAttention with the same modifier, and
PyTorch's cuDNN SDPA where the variant is expressible there (causal), on the same inputs in one
process. bf16, d = 128, 16k tokens (batch = 16384 / seqlen), 16 heads; forward, and
forward+backward as one call (autograd on both sides).

    python bench/flex_bench.py [--seqlens 1024,4096,16384] [--out DIR]

Timing as bench/bench.py: CUDA events after a GPU sleep that covers the host's launch work,
warm-up, median of 20 runs. FLOPs count the visible (query, key) pairs: 4 * b * h * d * pairs
for the forward, x3.5 for forward+backward. Writes flex-<device>-<date>.md under --out.
"""

import argparse
import datetime
import os
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import fusedattn
from fusedattn import flex

HEADS, DIM, TOKENS, WINDOW = 16, 128, 16384, 256


def variants():
    """name -> (fusedattn kwargs, FlexAttention score_mod, FlexAttention mask_mod or None,
    visible pairs per (b, h) as a function of s, torch SDPA kwargs or None)."""
    return {
        "causal by index (mask_mod)": (
            dict(mask_mod=flex.kv_idx <= flex.q_idx), None,
            lambda b, h, q, kv: kv <= q, lambda s: s * (s + 1) / 2, dict(is_causal=True)),
        "tanh soft-cap 30": (
            dict(score_mod=30 * flex.tanh(flex.score / 30)),
            lambda score, b, h, q, kv: 30 * torch.tanh(score / 30), None,
            lambda s: s * s, None),
        "relative bias q-kv": (
            dict(score_mod=flex.score + (flex.q_idx - flex.kv_idx)),
            lambda score, b, h, q, kv: score + (q - kv), None, lambda s: s * s, None),
        "causal window 256 (mask_mod)": (
            dict(mask_mod=(flex.kv_idx <= flex.q_idx) & (flex.q_idx - flex.kv_idx < WINDOW)),
            None, lambda b, h, q, kv: (kv <= q) & (q - kv < WINDOW),
            lambda s: sum(min(i + 1, WINDOW) for i in range(s)), None),
    }


def median_ms(fn, runs=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for i in range(runs):
        torch.cuda._sleep(2_000_000)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_directions(forward, q, k, v, d_o):
    """(fwd ms, fwd+bwd ms) of forward(q, k, v) -> o [b, s, h, d]."""
    with torch.no_grad():
        fwd = median_ms(lambda: forward(q, k, v))
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    both = median_ms(lambda: torch.autograd.grad(forward(*leaves), leaves, d_o))
    return fwd, both


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    # Every (modifier, shape, grad mode) is its own compilation: past dynamo's default limit of 8
    # FlexAttention would fall back to its unfused eager path (O(s^2) memory).
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    compiled = torch.compile(flex_attention, dynamic=False)
    rows = []
    for name, (ours_kwargs, score_mod, mask_mod, pairs, sdpa_kwargs) in variants().items():
        for s in (int(x) for x in args.seqlens.split(",")):
            if name.startswith("causal window") and s != 16384:
                continue
            b = TOKENS // s
            torch.manual_seed(0)
            q, k, v, d_o = (torch.randn(b, s, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
                            for _ in range(4))
            block_mask = (create_block_mask(mask_mod, None, None, s, s, device="cuda")
                          if mask_mod is not None else None)

            def ours(x, y, z):
                return fusedattn.attention(x, y, z, **ours_kwargs)

            def flex_fn(x, y, z):
                o = compiled(x.transpose(1, 2), y.transpose(1, 2), z.transpose(1, 2),
                             score_mod=score_mod, block_mask=block_mask)
                return o.transpose(1, 2)

            def sdpa(x, y, z):
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    o = torch.nn.functional.scaled_dot_product_attention(
                        x.transpose(1, 2), y.transpose(1, 2), z.transpose(1, 2), **sdpa_kwargs)
                return o.transpose(1, 2)

            flops = 4.0 * b * HEADS * DIM * pairs(s)
            times = {"fusedattn": time_directions(ours, q, k, v, d_o),
                     "flex": time_directions(flex_fn, q, k, v, d_o)}
            if sdpa_kwargs is not None:
                times["torch:cudnn"] = time_directions(sdpa, q, k, v, d_o)
            backend = fusedattn.explain(q, k, v, **ours_kwargs).splitlines()[0]
            for direction, index, factor in (("fwd", 0, 1.0), ("fwd+bwd", 1, 3.5)):
                rate = {impl: flops * factor / (t[index] * 1e-3) / 1e12
                        for impl, t in times.items()}
                row = (name, s, b, direction, times["fusedattn"][index], rate["fusedattn"],
                       times["flex"][index], rate["flex"],
                       times["flex"][index] / times["fusedattn"][index],
                       rate.get("torch:cudnn"), backend)
                rows.append(row)
                print("%-30s s=%-6d %-8s ours %8.3f ms %6.1f TF/s | flex %8.3f ms %6.1f TF/s "
                      "| flex/ours %.2f | %s" % (row[0], s, direction, row[4], row[5], row[6],
                                                row[7], row[8], backend), flush=True)
    device = torch.cuda.get_device_name().lower().replace(" ", "-")
    date = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "flex-%s-%s.md" % (device, date))
    with open(path, "w") as f:
        f.write("# Score modifiers: fusedattn vs compiled FlexAttention on %s\n\n" %
                torch.cuda.get_device_name())
        f.write("%s; torch %s, cuDNN %d, fusedattn %s. bf16, d = %d, %d heads, 16k tokens. "
                "Time in ms, rate in TFLOP/s over the visible pairs (x3.5 for fwd+bwd); "
                "flex/ours > 1 means fusedattn is faster.\n\n" %
                (date, torch.__version__, torch.backends.cudnn.version(),
                 fusedattn.__version__, DIM, HEADS))
        f.write("| variant | seqlen | batch | dir | fusedattn ms | TFLOP/s | flex ms | TFLOP/s "
                "| flex / ours | torch cuDNN TFLOP/s | fusedattn backend |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write("| %s | %d | %d | %s | %.3f | %.1f | %.3f | %.1f | %.2f | %s | %s |\n" % (
                r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                "-" if r[9] is None else "%.1f" % r[9], r[10]))
    print("wrote %s" % path)


if __name__ == "__main__":
    main()
