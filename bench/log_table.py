"""Rebuilds a Markdown table from a bench.py run log (its "label | impl | dir: X ms" lines),
for a run that was cut off before bench.py wrote its own table. Rates use bench.py's own FLOP and
byte counting; "ours/best" is fusedattn:auto over the best PyTorch implementation.

    python bench/log_table.py RUN.log --grid small_seq --copy-tbps 3.01 > table.md
"""
import argparse
import re
import sys

import bench

LINE = re.compile(r"^(?P<label>.+?) \| (?P<impl>[\w:]+) \| (?P<dir>fwd\+bwd|fwd|bwd): (?P<rest>.*)$")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--grid", required=True, choices=["prefill", "varlen", "small_seq", "decode"])
    ap.add_argument("--copy-tbps", type=float, required=True, help="measured copy bandwidth")
    args = ap.parse_args(argv)
    points = {p.label: p for p in getattr(bench, args.grid + "_grid")()}
    results, impls = {}, []
    for line in open(args.log):
        m = LINE.match(line.strip())
        if not m or m["label"] not in points:
            continue
        if m["impl"] not in impls:
            impls.append(m["impl"])
        t = re.match(r"([0-9.]+) ms", m["rest"])
        results[(m["label"], m["dir"], m["impl"])] = float(t.group(1)) if t else m["rest"][:12]
    out = sys.stdout
    out.write("| point | dir | " + " | ".join(impls) + " | ours/best torch | ours / copy |\n")
    out.write("|---" * (len(impls) + 4) + "|\n")
    for label, point in points.items():
        for direction in point.directions:
            row = [results.get((label, direction, i)) for i in impls]
            if all(r is None for r in row):
                continue
            amount = (bench.bytes_moved(point, direction) / 1e12 if point.unit == "tbps"
                      else bench.flops(point, direction) / 1e12)
            rates = [amount / (r / 1e3) if isinstance(r, float) else r for r in row]
            cells = ["%.3g" % x if isinstance(x, float) else (x or "-") for x in rates]
            ours = rates[impls.index("fusedattn:auto")] if "fusedattn:auto" in impls else None
            torch_rates = [x for i, x in zip(impls, rates)
                           if i.startswith("torch:") and isinstance(x, float)]
            ratio = "%.2f" % (ours / max(torch_rates)) if isinstance(ours, float) and torch_rates \
                else "-"
            floor = "%.0f%%" % (100 * ours / args.copy_tbps) if isinstance(ours, float) and \
                point.unit == "tbps" else "-"
            out.write("| %s | %s | %s | %s | %s |\n" % (label, direction, " | ".join(cells), ratio,
                                                       floor))


if __name__ == "__main__":
    main()
