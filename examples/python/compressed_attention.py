"""Compressed KV caches from Python: fill caches of several codecs with a 1000-token prompt's keys and values, run
decode attention on their packed pages, and compare it with float64 attention over the original tokens.

Run from anywhere once kvq is installed (pip install . in a clone; docs/python.md):
    python examples/python/compressed_attention.py
"""

import numpy as np

import kvq

rng = np.random.default_rng(0)
n_layers, n_kv_heads, n_q_heads, head_dim, n_tokens = 2, 2, 8, 128, 1000
keys = rng.standard_normal((n_tokens, n_kv_heads, head_dim), dtype=np.float32)
values = rng.standard_normal((n_tokens, n_kv_heads, head_dim), dtype=np.float32)
q = rng.standard_normal((1, n_q_heads, head_dim), dtype=np.float32)  # one query token of one sequence

# The same attention in float64 over the original tokens: query head j reads kv head j // (n_q_heads / n_kv_heads).
group = n_q_heads // n_kv_heads
exact = np.empty(q.shape)
for j in range(n_q_heads):
    k, v = keys[:, j // group].astype(np.float64), values[:, j // group].astype(np.float64)
    s = k @ q[0, j] / np.sqrt(head_dim)
    p = np.exp(s - s.max())
    exact[0, j] = p @ v / p.sum()

print(f"kvq {kvq.__version__}: {n_layers} layers x {n_tokens} tokens x {n_kv_heads} kv heads x {head_dim}")
print(f"{'keys':>12} {'values':>12} {'bits/elem':>9} {'MiB':>6} {'rel. error':>10}  kernel")
for key_codec, value_codec in [("f16", "f16"), ("int8", "int8"), ("int4", "int4"), ("turbo_mse:4", "turbo_mse:3")]:
    # A page holds 64 tokens of one layer of one sequence: n_layers * ceil(n_tokens / 64) pages.
    cache = kvq.KVCache(n_layers, n_kv_heads, head_dim, capacity_pages=n_layers * -(-n_tokens // 64),
                        key_codec=key_codec, value_codec=value_codec)
    seq = cache.add_sequence()
    for layer in range(n_layers):
        cache.append(seq, layer, keys, values)  # one prefill chunk; a decode step appends [1, n_kv_heads, head_dim]
    out = cache.decode_attention(0, [seq], q)  # [1, n_q_heads, head_dim], computed on the packed pages
    memory = cache.memory()
    error = np.linalg.norm(out - exact) / np.linalg.norm(exact)
    print(f"{key_codec:>12} {value_codec:>12} {memory['bits_per_element']:9.2f} {memory['used_bytes'] / 2**20:6.2f} "
          f"{error:10.2e}  {cache.attention_kernel(0)}")

# A codec on its own: vectors into blocks of bytes and back.
codec = kvq.Codec("turbo_mse:3", head_dim)
x = np.ascontiguousarray(keys[:, 0])  # kvq reads arrays in place: they must be C-contiguous
blocks = codec.encode(x)  # uint8 [ceil(n / 64), block_bytes]
mse = np.mean(np.sum((codec.decode(blocks, len(x)) - x) ** 2, axis=1) / np.sum(x**2, axis=1))
print(f"{codec.spec}: {codec.bits_per_element:.3f} bits per element, relative MSE {mse:.4f}")
