"""Markdown rows of docs/quality.md from the pieces of scripts/quality-pieces.sh: every cache's figures over all
pieces, weighted by the tokens each piece scored (mean NLL, f16 mean NLL, KLD, top-1), cache bytes of the first."""
import sys

from quality_rows import merge

try:
    caches = merge(sys.argv[1:])
except ValueError as e:
    sys.exit(str(e))
if caches:
    first = caches[0]
    print(f"ctx {first['ctx']}, {first['tokens']} scored tokens in {first['pieces']} pieces, "
          f"f16 perplexity {first['ppl_f16']:.4f}, f16 cache {first['cache_bytes_f16']} bytes\n")
print("| keys / values | bits k / v | cache bytes | vs f16 | ppl | dPPL % | KLD | top-1 |")
print("|---|---|---|---|---|---|---|---|")
for c in caches:
    name = f"`{c['k']}` / `{c['v']}`" if c["k"] else c["label"]
    print(f"| {name} | {c['bits_k']:.2f} / {c['bits_v']:.2f} | {c['cache_bytes']} | "
          f"{c['cache_bytes_f16'] / c['cache_bytes']:.2f}x | {c['ppl']:.4f} | {c['dppl_pct']:+.2f} | "
          f"{c['kld']:.4f} | {c['top1']:.4f} |")
