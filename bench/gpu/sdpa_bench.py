#!/usr/bin/env python3
"""The baseline users pick today: PyTorch scaled_dot_product_attention in bf16 with enable_gqa=True, one query
token per sequence (decode), over the shapes of bench/gpu/run.sh. One JSON object per shape on stdout.

Times are CUDA-event medians; where one cache is smaller than several times the L2 cache, several caches are
allocated and the calls rotate over them, so that every call reads its keys and values from memory."""
import argparse
import json

import torch
import torch.nn.functional as F

ROTATE_BYTES = 512 << 20


def time_shape(batch, ctx, q_heads, kv_heads, dim, reps):
    dev = torch.device("cuda")
    cache_bytes = 2 * batch * kv_heads * ctx * dim * 2
    copies = max(1, min(16, -(-ROTATE_BYTES // cache_bytes)))
    gen = torch.Generator(device=dev).manual_seed(1)
    caches = [(torch.randn(batch, kv_heads, ctx, dim, device=dev, dtype=torch.bfloat16, generator=gen),
               torch.randn(batch, kv_heads, ctx, dim, device=dev, dtype=torch.bfloat16, generator=gen))
              for _ in range(copies)]
    q = torch.randn(batch, q_heads, 1, dim, device=dev, dtype=torch.bfloat16, generator=gen)
    for k, v in caches:  # warm-up, every copy once
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    times = []
    for i in range(reps):
        k, v = caches[i % copies]
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    assert torch.isfinite(out).all()
    times.sort()
    us = times[len(times) // 2] * 1e3
    del caches
    torch.cuda.empty_cache()
    return {"batch": batch, "ctx": ctx, "q_heads": q_heads, "kv_heads": kv_heads, "dim": dim, "us_per_call": us,
            "gbps": cache_bytes / (us * 1e3), "copies": copies, "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=[f"{b}x{c}" for b in (1, 8, 32) for c in (4096, 32768, 131072)],
                    help="batch x ctx, e.g. 8x32768")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    for shape in a.shapes:
        b, c = map(int, shape.split("x"))
        print(json.dumps(time_shape(b, c, 32, 8, 128, a.reps)), flush=True)


if __name__ == "__main__":
    main()
