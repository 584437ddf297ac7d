#!/usr/bin/env python3
"""The kernels behind one benchmark point: a fusedattn backend (cuDNN by default) and a PyTorch
SDPA backend (cuDNN by default), each run forward + backward a few times under torch.profiler,
with every CUDA kernel's name, launch count and mean time. For points where the two differ in
time (bench/results/*-ratios-*.md): which kernel, or which extra launch.

    python bench/kernel_profile.py --dtype bf16 --d 64 --seqlen 16384 --causal
    python bench/kernel_profile.py --ours flash --theirs flash --d 128 --seqlen 1024
"""

import argparse
import collections

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import fusedattn


def kernels(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    totals = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[event.name]
            entry[0] += 1
            entry[1] += event.device_time
    return {name: (count / iters, us / iters) for name, (count, us) in totals.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--ours", default="cudnn", help="fusedattn backend")
    parser.add_argument("--theirs", default="cudnn", choices=["cudnn", "flash", "efficient"],
                        help="PyTorch SDPA backend")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    batch, heads = args.tokens // args.seqlen, args.hidden // args.d
    shape = (batch, args.seqlen, heads, args.d)  # BSHD
    q, k, v, d_o = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

    def ours():
        o = fusedattn.attention(*leaves, layout="bshd", mask="causal" if args.causal else None,
                                backend=args.ours)
        torch.autograd.grad(o, leaves, d_o)

    sdpa_backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION}[args.theirs]

    def theirs():
        with sdpa_kernel(sdpa_backend):
            o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in leaves),
                                               is_causal=args.causal)
        torch.autograd.grad(o, leaves, d_o.transpose(1, 2))

    print("point: %s d%d h%d b%d s%d%s, fwd+bwd, per iteration"
          % (args.dtype, args.d, heads, batch, args.seqlen, " causal" if args.causal else ""))
    for label, fn in (("fusedattn:" + args.ours, ours), ("torch:" + args.theirs, theirs)):
        table = kernels(fn, args.iters)
        total = sum(us for _, us in table.values())
        print("\n== %s: %.1f us of kernels" % (label, total))
        for name, (count, us) in sorted(table.items(), key=lambda item: -item[1][1]):
            print("%10.1f us  x%.1f  %s" % (us, count, name[:150]))


if __name__ == "__main__":
    main()
