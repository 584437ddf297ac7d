#!/usr/bin/env python3
"""Where fwd+bwd as one call loses time against the sum of fwd and bwd timed alone: times the
training forward (inputs that require grad, so LSE/stats are written) on its own, next to the
inference forward, the backward and forward+backward, for fusedattn's cuDNN backend and PyTorch's
cuDNN SDPA on the same inputs, with CUDA events (median of 30, after warm-up).

    python bench/cudnn_train_probe.py
"""

import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusedattn

POINTS = [  # (dtype, d, b, h, s, causal)
    (torch.bfloat16, 128, 1, 16, 16384, False),
    (torch.bfloat16, 64, 1, 32, 16384, False),
    (torch.bfloat16, 64, 32, 32, 512, True),
    (torch.bfloat16, 128, 2, 16, 8192, False),
]


def median_ms(fn, runs=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        torch.cuda._sleep(2_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    print("%-34s %-10s %9s %9s %9s %9s %9s" % ("point", "impl", "fwd", "fwd-train", "bwd",
                                              "fwd+bwd", "f+b - sum"))
    for dtype, d, b, h, s, causal in POINTS:
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(4))
        ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))

        def ours(x, y, z):
            return fusedattn.attention(x, y, z, mask="causal" if causal else "none",
                                       backend="cudnn")

        def torch_cudnn(x, y, z):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                o = torch.nn.functional.scaled_dot_product_attention(
                    x.transpose(1, 2), y.transpose(1, 2), z.transpose(1, 2), is_causal=causal)
            return o.transpose(1, 2)

        for name, f in (("ours", ours), ("torch", torch_cudnn)):
            with torch.no_grad():
                fwd = median_ms(lambda: f(q, k, v))
            train = median_ms(lambda: f(ql, kl, vl))
            out = f(ql, kl, vl)
            bwd = median_ms(lambda: torch.autograd.grad(out, (ql, kl, vl), do, retain_graph=True))
            both = median_ms(lambda: torch.autograd.grad(f(ql, kl, vl), (ql, kl, vl), do))
            label = "d%d b%d h%d s%d%s" % (d, b, h, s, " causal" if causal else "")
            print("%-34s %-10s %9.3f %9.3f %9.3f %9.3f %9.3f" % (label, name, fwd, train, bwd,
                                                               both, both - train - bwd))


if __name__ == "__main__":
    main()
