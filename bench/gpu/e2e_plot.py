"""Draws bench/gpu/e2e.py's JSON rows: decode tokens/s against context, one panel per batch size, one line per cache
(log-log), into a PNG; prints the cells as a markdown table (ms per step, median, and tokens/s; or why a cell did
not run) and the computed largest batch per cache. Of several rows for one cache and shape, the last counts.

    python3 bench/gpu/e2e_plot.py e2e.jsonl --png docs/perf/e2e.png
"""

from __future__ import annotations

import argparse
import json
import sys


def load(path: str) -> tuple[list[dict], dict, dict]:
    """The meta row of the last call, the last cell row per (cache, batch, ctx), the last capacity row per cache."""
    meta, cells, capacity = {}, {}, {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if row["kind"] == "meta":
                meta = row
            elif row["kind"] == "cell":
                cells[(row["cache"], row["batch"], row["ctx"])] = row
            elif row["kind"] == "capacity":
                capacity[row["cache"]] = row
    return meta, cells, capacity


def caches_in_order(cells: dict) -> list[str]:
    return list(dict.fromkeys(cache for cache, _, _ in cells))


def table(cells: dict, capacity: dict) -> str:
    shapes = sorted({(b, c) for _, b, c in cells}, key=lambda s: (s[1], s[0]))
    at = next((row["ctx"] for row in capacity.values()), "")
    lines = ["| cache | " + " | ".join(f"{b} x {c}" for b, c in shapes) + f" | largest batch at {at} |",
             "|---" * (len(shapes) + 2) + "|"]
    for cache in caches_in_order(cells):
        out = []
        for b, c in shapes:
            row = cells.get((cache, b, c))
            if row is None:
                out.append("")
            elif row["status"] == "ok":
                out.append(f"{row['ms_per_step_median']:.1f} ({row['tokens_per_s']:.0f})")
            else:
                out.append(row["status"])
        limit = capacity.get(cache, {}).get("max_batch", "")
        lines.append(f"| `{cache}` | " + " | ".join(out) + f" | {limit} |")
    return "\n".join(lines)


def plot(cells: dict, meta: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({b for _, b, _ in cells})
    # One colour per cache in every panel, and every cache in the legend of each.
    colours = {cache: f"C{i % 10}" for i, cache in enumerate(caches_in_order(cells))}
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4.5), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        for cache in caches_in_order(cells):
            points = sorted((c, row["tokens_per_s"]) for (name, b, c), row in cells.items()
                            if name == cache and b == batch and row["status"] == "ok")
            if points:
                ax.plot(*zip(*points), marker="o", label=cache, color=colours[cache])
        ax.set_xscale("log", base=2)
        contexts = sorted({c for _, b, c in cells if b == batch})
        ax.set_xticks(contexts, [f"{c // 1024}K" if c % 1024 == 0 else str(c) for c in contexts])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens per sequence)")
        ax.set_ylabel("decode tokens/s (all sequences)")
        ax.set_title(f"batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    title = meta.get("gpu") or meta.get("device", "")
    fig.suptitle(f"{meta.get('model', '')}, random weights, {title}; torch {meta.get('torch', '')}, "
                 f"transformers {meta.get('transformers', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="e2e.py's --json file")
    parser.add_argument("--png", help="write the plot here")
    args = parser.parse_args(argv)
    meta, cells, capacity = load(args.json)
    if not cells:
        print(f"e2e_plot: no cells in {args.json}", file=sys.stderr)
        return 1
    print(table(cells, capacity))
    if args.png:
        plot(cells, meta, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
