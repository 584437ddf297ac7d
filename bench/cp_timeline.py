#!/usr/bin/env python3
"""The timeline of one context-parallel step from cp_bench.py's trace (--profile: rank 0's chrome
trace, gzip'd): a plot of the GPU's kernels in two lanes, compute (attention, the LSE merges,
copies) and NCCL, and the figures that say whether communication is hidden:

  span         first kernel start to last kernel end (the step on the GPU)
  compute      the union of the compute kernels' intervals
  idle         span - compute: time the GPU computed nothing (waiting for a transfer or the host)
  nccl         the union of the NCCL kernels' intervals; an NCCL receive is posted before the
               block it overlaps and spins until the peer's data is there, so its length counts
               the wait as well as the transfer: it says where communication was in flight, not
               what it cost. The cost is `idle`.

    python3 bench/cp_timeline.py TRACE.json.gz [...] --png OUT.png [--json OUT.json]
"""

import argparse
import gzip
import json
import os


def kernels(path):
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    out = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            out.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]))
    return sorted(out)


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def summary(ks):
    """The figures above of kernels ks, (start, end, name) in microseconds (cp_bench.py's profile
    reports them too)."""
    t0 = min(a for a, _, _ in ks)
    t1 = max(b for _, b, _ in ks)
    compute = union([(a, b) for a, b, n in ks if "nccl" not in n.lower()])
    nccl = union([(a, b) for a, b, n in ks if "nccl" in n.lower()])
    busy = sum(b - a for a, b in compute)
    return dict(span_ms=round((t1 - t0) / 1e3, 3), compute_ms=round(busy / 1e3, 3),
                idle_ms=round((t1 - t0 - busy) / 1e3, 3),
                idle_fraction=round((t1 - t0 - busy) / (t1 - t0), 4) if t1 > t0 else None,
                nccl_in_flight_ms=round(sum(b - a for a, b in nccl) / 1e3, 3),
                nccl_kernels=sum(1 for *_, n in ks if "nccl" in n.lower()))


def lane_of(name):
    n = name.lower()
    if "nccl" in n:
        return "NCCL"
    if "sdpa" in n or "fusedattn" in n or "cudnn" in n:
        return "attention"
    return "other compute"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--png", required=True)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = ["attention", "other compute", "NCCL"]
    colors = {"attention": "tab:blue", "other compute": "tab:green", "NCCL": "tab:orange"}
    fig, axes = plt.subplots(len(args.traces), 1, figsize=(11, 1.6 + 1.3 * len(args.traces)),
                             squeeze=False)
    results = {}
    for ax, path in zip(axes[:, 0], args.traces):
        ks = kernels(path)
        t0 = min(a for a, _, _ in ks)
        s = summary(ks)
        name = os.path.basename(path).split(".")[0]
        results[name] = s
        for lane_index, lane in enumerate(lanes):
            spans = [((a - t0) / 1e3, (b - a) / 1e3) for a, b, n in ks if lane_of(n) == lane]
            ax.broken_barh(spans, (lane_index - 0.4, 0.8), color=colors[lane])
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_xlabel("ms")
        ax.set_title("%s: span %.0f ms, compute %.0f ms, GPU idle %.1f%%" %
                     (name, s["span_ms"], s["compute_ms"], 100 * s["idle_fraction"]), fontsize=9)
        print(name, json.dumps(s))
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
