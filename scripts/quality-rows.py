"""Markdown rows from `kvq ppl --json` lines on stdin (the format of docs/quality.md)."""
import json
import sys

rows = [json.loads(line) for line in sys.stdin if line.strip()]
if rows:
    r = rows[0]
    print(f"ctx {r['ctx']}, {r['tokens']} scored tokens, f16 perplexity {r['ppl_f16']:.4f}, "
          f"f16 cache {r['cache_bytes_f16']} bytes\n")
print("| keys / values | bits k / v | cache bytes | vs f16 | ppl | dPPL % | KLD | top-1 |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    layers = f" (layers {','.join(map(str, r['layers']))})" if "layers" in r else ""
    print(f"| `{r['k']}` / `{r['v']}`{layers} | {r['bits_per_element_k']:.2f} / {r['bits_per_element_v']:.2f} | "
          f"{r['cache_bytes']} | {r['cache_bytes_f16'] / r['cache_bytes']:.2f}x | {r['ppl']:.4f} | "
          f"{r['delta_ppl_pct']:+.2f} | {r['kld']:.4f} | {r['top1_agree']:.4f} |")
