#!/usr/bin/env python3
"""Context parallelism (fusedattn.distributed): the training step (forward + backward) of
attention over a sequence split across N GPUs, against the single-GPU call, and its check.

On one GPU (no torchrun): every rank's part simulated in this process, without communication
(fusedattn.distributed.simulate's code path: the same blocks, library calls and merges a rank
runs under torch.distributed). For each sequence length and N it prints the single-GPU step,
each rank's step, and ratio = slowest rank / (single / N): the part of the 1.1x target that
compute and load balance decide (transfers excluded); and the relative error of the ranks'
results put together against the single-GPU call.

    python3 bench/cp_bench.py [--seqlens 131072 262144 524288] [--worlds 2 4] [--out DIR]

With torchrun (NCCL, one process per GPU; NVLink multicast stays off, NCCL_NVLS_ENABLE=0):

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=N bench/cp_bench.py [--profile DIR]

every rank runs context_parallel_attention on its part; the step time is the slowest rank's
(between CUDA events, after a barrier), ratio = step / (single-GPU step / N), with the
single-GPU step timed on rank 0 alone; the ranks' results are gathered on rank 0 and checked
against the single-GPU call (bf16 bound 1e-2). --profile writes rank 0's trace of one step
(chrome trace, gzip) and prints per rank how much of the NCCL kernels' time overlapped attention
kernels.

Defaults: bf16, b=1, heads 16 (K/V 16), d=128, causal, mode ring; --device cpu with small
--seqlens is a dry run of the script (its figures mean nothing).
"""

import argparse
import gzip
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import fusedattn
import fusedattn.distributed as cp
from cp_timeline import summary as timeline_summary  # bench/, beside this script

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqlens", type=int, nargs="+", default=[131072, 262144, 524288])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4],
                   help="simulated world sizes (one GPU); torchrun's is its own")
    p.add_argument("--modes", nargs="+", default=["ring"], choices=cp.MODES)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--heads-kv", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mask", default="causal")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-check", action="store_true", help="skip the comparison of results")
    p.add_argument("--profile", default=None, help="torchrun: write rank 0's trace here")
    p.add_argument("--out", default=None, help="folder for cp_bench.jsonl")
    return p.parse_args()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, iters, warmup):
    """The median wall time of fn() in ms, synchronized before and after each call (a step is
    tens of ms to seconds: the synchronization costs nothing next to it)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def whole_tensors(args, s, device, seed=0):
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    hkv = args.heads_kv or args.heads

    def randn(h):
        return torch.randn((args.batch, s, h, args.head_dim), generator=g, device=device,
                           dtype=dtype)
    return dict(q=randn(args.heads), k=randn(hkv), v=randn(hkv), d_o=randn(args.heads))


def single_step(t, mask):
    """The single-device step: returns a function running forward + backward, and one that
    returns (o, dq, dk, dv) of a run."""
    leaves = [t[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]

    def step():
        for x in leaves:
            x.grad = None
        o = fusedattn.attention(*leaves, layout="bshd", mask=mask)
        o.backward(t["d_o"])
        return o

    def results():
        o = step()
        return dict(o=o.detach(), dq=leaves[0].grad, dk=leaves[1].grad, dv=leaves[2].grad)
    return step, results


def flops(args, s):
    pairs = s * s / 2 if args.mask.startswith("causal") else s * s
    return 4 * args.batch * args.heads * args.head_dim * pairs * 3.5  # forward + backward


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def emit(args, record):
    print(json.dumps(record), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "cp_bench.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------------------------------------
# One GPU: simulated ranks
# ---------------------------------------------------------------------------------------------


def simulated(args):
    device = torch.device(args.device)
    print("device:", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    for s in args.seqlens:
        t = whole_tensors(args, s, device)
        step, results = single_step(t, args.mask)
        single_ms = timed(step, device, args.iters, args.warmup)
        reference = None if args.no_check else results()
        emit(args, dict(kind="single", seqlen=s, ms=round(single_ms, 3),
                        tflops=round(flops(args, s) / single_ms / 1e9, 1)))
        for mode in args.modes:
            for world in args.worlds:
                rank_ms = []
                problem = dict(layout="bshd", mask=args.mask)
                if mode == "all_to_all" and args.heads % world:
                    continue
                # Each rank's step alone (simulate(ranks=[r]) shards the whole tensors, a copy
                # that a rank does not do: timed here on prepared parts, as the ranks hold them).
                sim = Simulation(t, world, mode, problem)
                if mode == "all_to_all":  # a rank's part of o needs every head group: together
                    total = timed(lambda: sim.run(None), device, args.iters, args.warmup)
                    rank_ms = [total / world] * world
                for r in range(world if mode != "all_to_all" else 0):
                    rank_ms.append(timed(lambda: sim.run([r]), device, args.iters, args.warmup))
                record = dict(kind="simulated", mode=mode, world=world, seqlen=s,
                              single_ms=round(single_ms, 3),
                              rank_ms=[round(x, 3) for x in rank_ms],
                              ratio=round(max(rank_ms) / (single_ms / world), 3),
                              work_ratio=round(sum(rank_ms) / single_ms, 3))
                if reference is not None:
                    record["rel_err"] = sim.errors(reference)
                emit(args, record)
        del t, reference
        if device.type == "cuda":
            torch.cuda.empty_cache()


class Simulation:
    """The ranks' parts prepared once; run(ranks) is those ranks' forward + backward."""

    def __init__(self, t, world, mode, problem):
        self.world, self.mode, self.problem = world, mode, problem
        self.t = t
        self.parts = {n: [cp.shard(t[n], r, world).contiguous() for r in range(world)]
                      for n in ("q", "k", "v", "d_o")}
        self.probs = [cp._make_problem(self.parts["q"][r], self.parts["k"][r],
                                       self.parts["v"][r], mode, r, world, None, dict(problem))
                      for r in range(world)]

    def run(self, ranks):
        """Those ranks' results (None: every rank)."""
        if self.mode == "ring":
            ranks = range(self.world) if ranks is None else ranks
            return cp._simulate_ring(self.probs, ranks, self.parts["q"], self.parts["k"],
                                     self.parts["v"], self.parts["d_o"], None)
        t = self.t
        return cp.simulate(t["q"], t["k"], t["v"], self.world, mode=self.mode, d_o=t["d_o"],
                           ranks=ranks, **self.problem)

    def errors(self, reference):
        parts = self.run(None)
        return {n: float("%.3g" % rel(cp.unshard([p[n] for p in parts]), reference[n]))
                for n in ("o", "dq", "dk", "dv")}


# ---------------------------------------------------------------------------------------------
# torchrun: NCCL
# ---------------------------------------------------------------------------------------------


def distributed(args):
    for name, value in MULTICAST_OFF.items():
        os.environ.setdefault(name, value)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cpu":  # a dry run of the script with gloo
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print("torchrun: %d ranks, %s, NCCL_NVLS_ENABLE=%s" % (
            world, torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (gloo)",
            os.environ.get("NCCL_NVLS_ENABLE")), flush=True)
    for s in args.seqlens:
        t = whole_tensors(args, s, device)
        single_ms, reference = None, None
        if rank == 0:
            step, results = single_step(t, args.mask)
            single_ms = timed(step, device, args.iters, args.warmup)
            reference = None if args.no_check else results()
        dist.barrier()
        for mode in args.modes:
            if mode == "all_to_all" and args.heads % world:
                continue
            parts = {n: cp.shard(t[n], rank, world).contiguous() for n in ("q", "k", "v", "d_o")}
            leaves = [parts[n].requires_grad_() for n in ("q", "k", "v")]

            def step():
                for x in leaves:
                    x.grad = None
                o = cp.context_parallel_attention(*leaves, mode=mode, layout="bshd",
                                                  mask=args.mask)
                o.backward(parts["d_o"])
                return o

            def timed_step():
                dist.barrier()
                return timed(step, device, 1, 0)

            for _ in range(args.warmup):
                step()
            mine = statistics.median(timed_step() for _ in range(args.iters))
            slowest = torch.tensor([mine], device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            record = dict(kind="torchrun-" + dist.get_backend(), mode=mode, world=world, seqlen=s,
                          step_ms=round(slowest.item(), 3))
            if not args.no_check:
                o = step()
                gathered = {n: _gather(x, world) for n, x in
                            (("o", o.detach()), ("dq", leaves[0].grad), ("dk", leaves[1].grad),
                             ("dv", leaves[2].grad))}
                if rank == 0:
                    record["rel_err"] = {n: float("%.3g" % rel(cp.unshard(g), reference[n]))
                                         for n, g in gathered.items()}
            if args.profile and device.type == "cuda":
                record["overlap"] = _profile(step, args.profile, rank, mode, s, world)
            if rank == 0:
                record["single_ms"] = round(single_ms, 3)
                record["ratio"] = round(record["step_ms"] / (single_ms / world), 3)
                emit(args, record)
            dist.barrier()
        del t, reference
        if device.type == "cuda":
            torch.cuda.empty_cache()
    dist.destroy_process_group()


def _gather(x, world):
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return parts


def _profile(step, folder, rank, mode, s, world):
    """One step under torch.profiler on every rank: the step's span on the GPU (first kernel start
    to last kernel end), the union of its compute (non-NCCL) kernels, and idle = span - compute,
    the time the GPU waited for a transfer or the host: what communication cost. NCCL's kernels
    are reported too, but a receive is posted before the block it overlaps and spins until the
    peer's data is there, so their length counts waiting as well as transfer. Rank 0's trace
    goes to folder (gzip'd chrome trace; bench/cp_timeline.py plots it)."""
    from torch.profiler import ProfilerActivity, profile
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    timeline = timeline_summary([(e.time_range.start, e.time_range.end, e.name)
                                 for e in prof.events()
                                 if e.device_type == torch.autograd.DeviceType.CUDA])
    summary = dict(rank=rank, gpu_span_ms=timeline["span_ms"],
                   compute_busy_ms=timeline["compute_ms"], gpu_idle_ms=timeline["idle_ms"],
                   gpu_idle_fraction=timeline["idle_fraction"],
                   nccl_in_flight_ms=timeline["nccl_in_flight_ms"])
    print("profile", json.dumps(summary), flush=True)
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "cp_%s_n%d_s%d_rank0.json" % (mode, world, s))
        prof.export_chrome_trace(path)
        with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
            g.write(f.read())
        os.remove(path)
    return summary


def main():
    args = parse()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        distributed(args)
    else:
        simulated(args)


if __name__ == "__main__":
    sys.exit(main())
