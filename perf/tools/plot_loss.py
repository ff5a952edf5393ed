#!/usr/bin/env python3
"""Training-loss curves of several runs in one SVG (no plotting library needed): the metrics
files meshtrain train writes (--train.metrics, one JSON object per step with "step" and
"loss"), each drawn raw (thin) and as a moving average (thick), with the mean of the last
--tail steps of each in the legend.

  perf/tools/plot_loss.py OUT.svg LABEL=run_a.jsonl LABEL=run_b.jsonl [--smooth 50] [--tail 50]
"""
import argparse
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def read(path):
    steps, losses = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "loss" in r and "step" in r and math.isfinite(r["loss"]):
                steps.append(r["step"])
                losses.append(r["loss"])
    if not losses:
        sys.exit(f"plot_loss: no step with a loss in {path}")
    return steps, losses


def moving_average(v, k):
    out, acc = [], 0.0
    for i, x in enumerate(v):
        acc += x
        if i >= k:
            acc -= v[i - k]
        out.append(acc / min(i + 1, k))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+", help="LABEL=metrics.jsonl")
    ap.add_argument("--smooth", type=int, default=50, help="moving-average window (steps)")
    ap.add_argument("--tail", type=int, default=50, help="legend: mean loss of the last N steps")
    ap.add_argument("--title", default="training loss")
    a = ap.parse_args()
    runs = []
    for spec in a.runs:
        label, _, path = spec.partition("=")
        if not path:
            sys.exit(f"plot_loss: '{spec}' is not LABEL=metrics.jsonl")
        runs.append((label, *read(path)))
    W, H, L, R, T, B = 900, 520, 70, 20, 40, 50
    xmax = max(max(s) for _, s, _ in runs)
    # The y range of the smoothed curves (the raw first steps would flatten everything else).
    smooth = [moving_average(v, a.smooth) for _, _, v in runs]
    lo = min(min(v[len(v) // 20:]) for v in smooth)
    hi = max(max(v[len(v) // 20:]) for v in smooth)
    pad = 0.08 * (hi - lo or 1.0)
    lo, hi = lo - pad, hi + pad

    def X(s):
        return L + (W - L - R) * s / xmax

    def Y(v):
        v = min(max(v, lo), hi)
        return T + (H - T - B) * (hi - v) / (hi - lo)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{a.title}</text>']
    for i in range(6):  # grid and tick labels
        v = lo + (hi - lo) * i / 5
        svg.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.3f}</text>')
        s = xmax * i / 5
        svg.append(f'<text x="{X(s):.1f}" y="{H - B + 18}" text-anchor="middle">{s:.0f}</text>')
    svg.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">step</text>')
    svg.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" '
               f'stroke="#444"/>')
    for k, ((label, steps, losses), sm) in enumerate(zip(runs, smooth)):
        c = COLORS[k % len(COLORS)]
        raw = " ".join(f"{X(s):.1f},{Y(v):.1f}" for s, v in zip(steps, losses))
        avg = " ".join(f"{X(s):.1f},{Y(v):.1f}" for s, v in zip(steps, sm))
        svg.append(f'<polyline points="{raw}" fill="none" stroke="{c}" stroke-opacity="0.25" '
                   f'stroke-width="1"/>')
        svg.append(f'<polyline points="{avg}" fill="none" stroke="{c}" stroke-width="2.2"/>')
        tail = losses[-a.tail:]
        text = (f"{label}: mean of the last {len(tail)} steps {sum(tail) / len(tail):.4f} "
                f"({len(losses)} steps)")
        y = T + 18 + 18 * k
        svg.append(f'<line x1="{W - R - 370}" x2="{W - R - 345}" y1="{y - 4}" y2="{y - 4}" '
                   f'stroke="{c}" stroke-width="2.2"/>')
        svg.append(f'<text x="{W - R - 340}" y="{y}">{text}</text>')
    svg.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(svg) + "\n")
    for label, _, losses in runs:
        tail = losses[-a.tail:]
        print(f"{label}: {len(losses)} steps, mean loss of the last {len(tail)} "
              f"{sum(tail) / len(tail):.4f}")


if __name__ == "__main__":
    main()
