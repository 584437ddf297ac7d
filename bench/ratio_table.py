"""Ratios of one implementation's time over another's, per point and direction, from bench.py
JSON results (several files, e.g. one run per dtype): the table an acceptance criterion such as
"fusedattn:cudnn >= 0.97x torch:cudnn on every point" is read from. A ratio is
time(reference) / time(impl): above 1, impl is faster.

    python bench/ratio_table.py A.json B.json --pair fusedattn:cudnn/torch:cudnn \
        --pair fusedattn:flash/torch:flash --pair fusedattn:flash/fusedattn:cudnn --bound 0.97
"""
import argparse
import json
import sys


def ratios(rows, impl, reference):
    """[(point, direction, ratio or None)] of time(reference) / time(impl) for every row."""
    out = []
    for row in rows:
        a, b = row["impls"].get(impl, {}), row["impls"].get(reference, {})
        ok = a.get("status") == "ok" and b.get("status") == "ok"
        out.append((row["point"], row["direction"], b["time_ms"] / a["time_ms"] if ok else None))
    return out


def table(rows, pairs, bound=None):
    """Markdown: one line per (point, direction), one column per pair, then a summary per pair
    (range, and with bound the rows under it)."""
    columns = [dict(((p, d), r) for p, d, r in ratios(rows, impl, ref)) for impl, ref in pairs]
    keys = [(row["point"], row["direction"]) for row in rows]
    lines = ["| point | dir | " + " | ".join("%s / %s" % pair for pair in pairs) + " |",
             "|---|---|" + "---|" * len(pairs)]
    for key in keys:
        cells = []
        for column in columns:
            r = column.get(key)
            mark = " **<**" if bound is not None and r is not None and r < bound else ""
            cells.append("-" if r is None else "%.3f%s" % (r, mark))
        lines.append("| %s | %s | %s |" % (key[0], key[1], " | ".join(cells)))
    lines.append("")
    for (impl, ref), column in zip(pairs, columns):
        values = [r for r in column.values() if r is not None]
        if not values:
            continue
        text = "%s vs %s: %.3f-%.3fx on %d points" % (impl, ref, min(values), max(values),
                                                      len(values))
        if bound is not None:
            under = [k for k in keys if column.get(k) is not None and column[k] < bound]
            listed = under if len(under) <= 8 else []  # name them when they are the few
            text += "; %d under %.2f%s" % (len(under), bound, (": " + "; ".join(
                "%s %s (%.3f)" % (p, d, column[(p, d)]) for p, d in listed)) if listed else "")
        lines.append("* " + text)
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="bench.py JSON files")
    parser.add_argument("--pair", action="append", required=True,
                        help="IMPL/REFERENCE, e.g. fusedattn:cudnn/torch:cudnn")
    parser.add_argument("--bound", type=float, default=None,
                        help="mark and list the ratios under this bound")
    args = parser.parse_args(argv)
    rows = []
    for path in args.results:
        with open(path) as f:
            rows += json.load(f)["rows"]
    pairs = [tuple(p.split("/", 1)) for p in args.pair]
    sys.stdout.write(table(rows, pairs, args.bound))
    return 0


if __name__ == "__main__":
    sys.exit(main())
