"""`kvq ppl --json` rows merged over the pieces of a long text (scripts/quality-pieces.sh): one entry per cache, its
figures weighted by the tokens each piece scored (mean NLL, f16 mean NLL, KLD, top-1), its bytes from the first."""

from __future__ import annotations

import json
import math
import os


def cache_label(row: dict) -> str:
    """How a row's cache is named: keys / values, or the calibration file of per-layer codecs."""
    if row.get("calib"):
        return f"calibrated ({os.path.basename(row['calib'])})"
    label = f"{row['k']} / {row['v']}"
    return label + ", centered keys" if row.get("center_keys") else label


def merge(paths: list[str]) -> list[dict]:
    """The caches of the rows in `paths` (JSON lines), in the order first seen. Each: label, k, v, ctx, tokens,
    pieces, ppl, ppl_f16, dppl_pct, kld, top1, bits_k, bits_v, bits (their mean: keys and values have as many
    elements), cache_bytes, cache_bytes_f16. A piece given twice for one cache is an error (ValueError)."""
    sums: dict[str, dict] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                r = json.loads(line)
                if "kld" not in r:  # f16 / f16 is the reference, not a compressed cache
                    continue
                c = sums.setdefault(cache_label(r), {"first": r, "tokens": 0, "nll": 0.0, "nll_f16": 0.0,
                                                     "kld": 0.0, "top1": 0.0, "pieces": set()})
                if r["skip_tokens"] in c["pieces"]:
                    raise ValueError(f"{path}: piece {r['skip_tokens']} of {cache_label(r)} given twice")
                c["pieces"].add(r["skip_tokens"])
                n = r["tokens"]
                c["tokens"] += n
                c["nll"] += n * r["mean_nll"]
                c["nll_f16"] += n * math.log(r["ppl_f16"])
                c["kld"] += n * r["kld"]
                c["top1"] += n * r["top1_agree"]
    caches = []
    for label, c in sums.items():
        n, r = c["tokens"], c["first"]
        ppl, ppl_f16 = math.exp(c["nll"] / n), math.exp(c["nll_f16"] / n)
        caches.append({"label": label, "k": r["k"], "v": r["v"], "ctx": r["ctx"], "tokens": n,
                       "pieces": len(c["pieces"]), "ppl": ppl, "ppl_f16": ppl_f16,
                       "dppl_pct": 100 * (ppl - ppl_f16) / ppl_f16, "kld": c["kld"] / n, "top1": c["top1"] / n,
                       "bits_k": r["bits_per_element_k"], "bits_v": r["bits_per_element_v"],
                       "bits": (r["bits_per_element_k"] + r["bits_per_element_v"]) / 2,
                       "cache_bytes": r["cache_bytes"], "cache_bytes_f16": r["cache_bytes_f16"]})
    return caches
