"""Markdown rows of docs/quality.md from the pieces of scripts/quality-pieces.sh: every cache's figures over all
pieces, weighted by the tokens each piece scored (mean NLL, f16 mean NLL, KLD, top-1), cache bytes of the first."""
import json
import math
import sys
from collections import OrderedDict

caches = OrderedDict()
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            key = (r["k"], r["v"])
            c = caches.setdefault(key, {"first": r, "tokens": 0, "nll": 0.0, "nll_f16": 0.0, "kld": 0.0,
                                        "top1": 0.0, "pieces": set()})
            if r["skip_tokens"] in c["pieces"]:
                sys.exit(f"{path}: piece {r['skip_tokens']} of {key} given twice")
            c["pieces"].add(r["skip_tokens"])
            n = r["tokens"]
            c["tokens"] += n
            c["nll"] += n * r["mean_nll"]
            c["nll_f16"] += n * math.log(r["ppl_f16"])
            c["kld"] += n * r["kld"]
            c["top1"] += n * r["top1_agree"]

if caches:
    first = next(iter(caches.values()))
    n = first["tokens"]
    print(f"ctx {first['first']['ctx']}, {n} scored tokens in {len(first['pieces'])} pieces, "
          f"f16 perplexity {math.exp(first['nll_f16'] / n):.4f}, f16 cache {first['first']['cache_bytes_f16']} bytes\n")
print("| keys / values | bits k / v | cache bytes | vs f16 | ppl | dPPL % | KLD | top-1 |")
print("|---|---|---|---|---|---|---|---|")
for (k, v), c in caches.items():
    n, r = c["tokens"], c["first"]
    ppl, ppl_f16 = math.exp(c["nll"] / n), math.exp(c["nll_f16"] / n)
    print(f"| `{k}` / `{v}` | {r['bits_per_element_k']:.2f} / {r['bits_per_element_v']:.2f} | {r['cache_bytes']} | "
          f"{r['cache_bytes_f16'] / r['cache_bytes']:.2f}x | {ppl:.4f} | {100 * (ppl - ppl_f16) / ppl_f16:+.2f} | "
          f"{c['kld'] / n:.4f} | {c['top1'] / n:.4f} |")
