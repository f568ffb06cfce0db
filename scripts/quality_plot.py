"""Quality against stored bits: every cache of `kvq ppl --json` rows (merged over a long text's pieces, as
scripts/quality-merge.py does) as a point of KLD against f16 (or dPPL %) over its mean stored bits per element,
one series per model (or context), the Pareto front of each drawn as a line: the caches a user picks from (none
fewer bits and better). Prints each series' front as a markdown table.

    python3 scripts/quality_plot.py --series "SmolLM2-135M, ctx 512" docs/quality-data/ctx512/*.jsonl \\
        --series "SmolLM2-135M, ctx 2048" docs/quality-data/ctx2048/*.jsonl --png docs/quality.png
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quality_rows import merge  # noqa: E402

METRICS = {"kld": "KL divergence against f16 (mean per token)", "dppl": "perplexity change against f16, %"}


def value(cache: dict, metric: str) -> float:
    return cache["kld"] if metric == "kld" else cache["dppl_pct"]


def pareto_front(caches: list[dict], metric: str) -> list[dict]:
    """The caches no other beats on both counts (fewer or as many bits and a lower figure), by bits."""
    front, best = [], float("inf")
    for c in sorted(caches, key=lambda c: (c["bits"], value(c, metric))):
        if value(c, metric) < best:
            front.append(c)
            best = value(c, metric)
    return front


def front_table(label: str, front: list[dict]) -> str:
    lines = [f"{label}: the Pareto front", "", "| cache | bits k / v (mean) | dPPL % | KLD | top-1 |",
             "|---|---|---|---|---|"]
    lines += [f"| {c['label']} | {c['bits_k']:.2f} / {c['bits_v']:.2f} ({c['bits']:.2f}) | {c['dppl_pct']:+.2f} | "
              f"{c['kld']:.4f} | {c['top1']:.4f} |" for c in front]
    return "\n".join(lines)


def plot(series: list[tuple[str, list[dict]]], metric: str, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    named = set()  # each cache named once, at its first series' point
    for i, (label, caches) in enumerate(series):
        colour = f"C{i % 10}"
        ax.scatter([c["bits"] for c in caches], [value(c, metric) for c in caches], color=colour, s=18, alpha=0.6)
        front = pareto_front(caches, metric)
        ax.plot([c["bits"] for c in front], [value(c, metric) for c in front], color=colour, marker="o",
                label=f"{label} (front)")
        for c in front:
            if c["label"] in named:
                continue
            named.add(c["label"])
            ax.annotate(c["label"], (c["bits"], value(c, metric)), fontsize=6, xytext=(3, 3),
                        textcoords="offset points", color=colour)
    if metric == "kld":
        ax.set_yscale("log")
    ax.set_xlabel("stored bits per element (keys and values, block bytes counted)")
    ax.set_ylabel(METRICS[metric])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", nargs="+", action="append", required=True, metavar=("LABEL", "FILE"),
                        help="a series' name, then its `kvq ppl --json` files")
    parser.add_argument("--metric", choices=sorted(METRICS), default="kld")
    parser.add_argument("--png", help="write the plot here")
    args = parser.parse_args(argv)
    series = []
    for label, *paths in args.series:
        if not paths:
            parser.error(f"--series {label!r}: no files")
        try:
            caches = merge(paths)
        except (OSError, ValueError, KeyError) as e:
            print(f"quality_plot: {label}: {e}", file=sys.stderr)
            return 1
        if not caches:
            print(f"quality_plot: {label}: no compressed caches in {len(paths)} files", file=sys.stderr)
            return 1
        series.append((label, caches))
        print(front_table(label, pareto_front(caches, args.metric)) + "\n")
    if args.png:
        plot(series, args.metric, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
