"""kvq.KVCache against the C++ behaviour it mirrors (tests/attention_test.cpp, tests/cache_test.cpp): decode and
prefill attention equal a float64 softmax over the cache's decoded tokens to 1e-5 (plus fp32 score rounding), f32
and f16 caches hold the values themselves, files round-trip, and bad input raises clear errors."""

import threading

import numpy as np
import pytest

import kvq
from reference import Attention, tokens

CODECS = ["f16", "bf16", "int8", "int4", "kivi:2", "turbo_mse:3", "turbo_prod:3", "qjl", "vecinfer:8/4"]


def filled_cache(rng, lengths, *, d=64, heads=2, key_codec="f16", value_codec="f16", residual=0, block=64,
                 outliers=True, layers=2, layer=1, chunks=(1, 7, 64, 100)):
    """A cache holding one sequence per length in `layer`, appended in chunks cycling through `chunks`; the layer's
    codecs trained first where they need it. Returns the cache, the sequence ids and the tokens appended."""
    pages = sum(n // block + 1 for n in lengths)
    cache = kvq.KVCache(layers, heads, d, capacity_pages=pages, key_codec=key_codec, value_codec=value_codec,
                        residual_tokens=residual, block_tokens=block, seed=int(rng.integers(2**32)))
    if not cache.ready(layer):
        keys, values = tokens(rng, 2048, 1, d, outliers)
        cache.train_layer(layer, keys[:, 0], values[:, 0])
    seqs, data = [], []
    for n in lengths:
        seq = cache.add_sequence()
        keys, values = tokens(rng, n, heads, d, outliers)
        pos, i = 0, 0
        while pos < n:
            step = min(chunks[i % len(chunks)], n - pos)
            cache.append(seq, layer, keys[pos:pos + step], values[pos:pos + step])
            pos, i = pos + step, i + 1
        seqs.append(seq)
        data.append((keys, values))
    return cache, seqs, data


def decode_reference(cache, layer, seqs, q, kv):
    """Each query head of q [B, Hq, d] against its kv head's tokens: kv[b] = (keys, values) [n, H, d]."""
    B, Hq, d = q.shape
    group = Hq // cache.n_kv_heads
    ref = Attention(B * Hq, d)
    for b in range(B):
        keys, values = kv[b]
        for j in range(Hq):
            ref.row(b * Hq + j, q[b, j], keys[:, j // group], values[:, j // group], 1 / np.sqrt(d))
    return ref


@pytest.mark.parametrize("key_codec", CODECS)
def test_decode_attention_matches_reference_over_decoded_cache(rng, key_codec):
    for value_codec in (key_codec, "f16"):
        for d, residual, group, lengths in [(64, 0, 4, [1, 63, 65, 0, 200]), (128, 64, 2, [130, 1])]:
            cache, seqs, _ = filled_cache(rng, lengths, d=d, key_codec=key_codec, value_codec=value_codec,
                                          residual=residual)
            q = rng.standard_normal((len(seqs), 2 * group, d)).astype(np.float32)
            out = cache.decode_attention(1, seqs, q)
            assert out.dtype == np.float32 and out.shape == q.shape
            ref = decode_reference(cache, 1, seqs, q, [cache.read(s, 1) for s in seqs])
            assert ref.worst(out) <= 1.0, (key_codec, value_codec, d)
            for b, n in enumerate(lengths):
                assert n > 0 or not out[b].any(), "a sequence without tokens gives zeros"


def test_sink_tokens_are_held_in_f16_and_attended(rng):
    """The first sink_tokens tokens of each sequence stay in f16 (read returns them rounded to f16, the rest decoded by
    the codec) and decode attention equals the reference over what read returns."""
    d, heads, sinks = 64, 2, 3
    cache = kvq.KVCache(2, heads, d, capacity_pages=8, key_codec="int4", value_codec="int4", sink_tokens=sinks)
    assert cache.sink_tokens == sinks
    seqs, data = [], []
    for n in (2, 70):
        seq = cache.add_sequence()
        keys, values = tokens(rng, n, heads, d, True)
        cache.append(seq, 1, keys, values)
        got_k, got_v = cache.read(seq, 1)
        held = min(n, sinks)
        assert np.array_equal(got_k[:held], keys[:held].astype(np.float16).astype(np.float32))
        assert np.array_equal(got_v[:held], values[:held].astype(np.float16).astype(np.float32))
        seqs.append(seq)
    q = rng.standard_normal((len(seqs), 2 * heads, d)).astype(np.float32)
    out = cache.decode_attention(1, seqs, q)
    ref = decode_reference(cache, 1, seqs, q, [cache.read(s, 1) for s in seqs])
    assert ref.worst(out) <= 1.0
    assert cache.memory()["sink_bytes"] == 2 * 2 * heads * (2 + sinks) * d  # f16 keys and values; 2 grows to 3
    with pytest.raises(kvq.Error, match="sink_tokens"):
        kvq.KVCache(1, heads, d, capacity_pages=1, sink_tokens=-1)


def test_float_caches_hold_the_values_themselves(rng):
    """f32 and f16 against attention over the original values (f16: rounded as the pages store them)."""
    lengths = [1, 64, 200]
    cache, seqs, data = filled_cache(rng, lengths, key_codec="f32", value_codec="f32", residual=64)
    q = rng.standard_normal((3, 8, 64)).astype(np.float32)
    for s, (keys, values) in zip(seqs, data):
        got_keys, got_values = cache.read(s, 1)
        np.testing.assert_array_equal(got_keys, keys)
        np.testing.assert_array_equal(got_values, values)
    assert decode_reference(cache, 1, seqs, q, data).worst(cache.decode_attention(1, seqs, q)) <= 1.0

    # f16 pages hold the values rounded to float16; the window (here the unfinished page) holds them as they are.
    cache, seqs, data = filled_cache(rng, lengths, key_codec="f16", value_codec="f16")
    halves = []
    for keys, values in data:
        paged = len(keys) // 64 * 64
        halves.append(tuple(np.concatenate([a[:paged].astype(np.float16).astype(np.float32), a[paged:]])
                            for a in (keys, values)))
    for s, (keys, values) in zip(seqs, halves):
        got_keys, got_values = cache.read(s, 1)
        np.testing.assert_array_equal(got_keys, keys)
        np.testing.assert_array_equal(got_values, values)
    assert decode_reference(cache, 1, seqs, q, halves).worst(cache.decode_attention(1, seqs, q)) <= 1.0


def test_prefill_attention_matches_causal_reference(rng):
    for key_codec in ("f16", "int4"):
        cache, (seq,), _ = filled_cache(rng, [300], key_codec=key_codec, value_codec="bf16", residual=64)
        keys, values = cache.read(seq, 1)
        for start, n in [(0, 7), (63, 64), (130, 100), (299, 1)]:
            q = rng.standard_normal((n, 4, 64)).astype(np.float32)
            out = cache.prefill_attention(1, seq, start, q)
            ref = Attention(n * 4, 64)
            for p in range(n):
                for j in range(4):
                    visible = start + p + 1
                    ref.row(p * 4 + j, q[p, j], keys[:visible, j // 2], values[:visible, j // 2], 1 / 8)
            assert ref.worst(out) <= 1.0, (key_codec, start, n)
        last = cache.prefill_attention(1, seq, 299, q[:1])
        np.testing.assert_array_equal(last, cache.decode_attention(1, [seq], q[:1]))


def test_scale_window_and_out(rng):
    cache, seqs, _ = filled_cache(rng, [200, 90], residual=64)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    keys, values = zip(*(cache.read(s, 1) for s in seqs))
    ref = Attention(8, 64)
    for b in range(2):
        for j in range(4):
            window = slice(len(keys[b]) - 50, None)
            ref.row(b * 4 + j, q[b, j], keys[b][window, j // 2], values[b][window, j // 2], 0.3)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    assert cache.decode_attention(1, seqs, q, scale=0.3, window=50, out=out) is out
    assert ref.worst(out) <= 1.0
    np.testing.assert_array_equal(cache.decode_attention(1, seqs, q, scale=0.3, window=50), out)


def test_sequences_lengths_memory_and_kernel(rng):
    cache, seqs, _ = filled_cache(rng, [130, 5], key_codec="int4", value_codec="int4", layers=2, layer=0)
    assert cache.sequences == seqs
    assert cache.length(seqs[0], 0) == 130 and cache.length(seqs[0], 1) == 0
    with pytest.raises(kvq.Error, match="append every layer"):
        cache.length(seqs[0])
    m = cache.memory()
    assert m["pages_in_use"] == 2 and m["pages_capacity"] == cache.capacity_pages
    assert m["encoded_bytes"] == 2 * m["page_bytes"] and m["pool_bytes"] == cache.capacity_pages * m["page_bytes"]
    assert m["used_bytes"] == m["encoded_bytes"] + m["residual_bytes"] + m["block_table_bytes"] + \
        m["codec_state_bytes"] + m["key_offset_bytes"] + m["sink_bytes"]
    assert m["bits_per_element"] == pytest.approx(4.5, rel=0.05)
    assert cache.free_pages == cache.capacity_pages - 2
    assert cache.attention_kernel(0).startswith(("fused_int4_int4", "generic"))
    assert kvq.attention_isa() in ("scalar", "avx2", "avx512", "avx512vnni", "avx512bf16", "neon")
    cache.remove_sequence(seqs[0])
    assert cache.sequences == [seqs[1]] and cache.free_pages == cache.capacity_pages
    assert cache.add_sequence() == seqs[1] + 1
    assert (cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.block_tokens) == (2, 2, 64, 64)
    assert cache.key_codec.startswith("int4") and cache.threads >= 1


def test_save_and_load_round_trip(rng, tmp_path):
    cache, seqs, _ = filled_cache(rng, [150, 20], key_codec="vecinfer:8/4", value_codec="int4", residual=64)
    path = tmp_path / "cache.kvq"
    cache.save(path)
    loaded = kvq.KVCache.load(str(path), threads=1)
    assert loaded.sequences == seqs
    # The same pages and tables; the windows, which grow as they fill, are loaded at the size of their tokens.
    grown = ("residual_bytes", "used_bytes", "total_bytes")
    mine, theirs = loaded.memory(), cache.memory()
    assert {k: v for k, v in mine.items() if k not in grown} == {k: v for k, v in theirs.items() if k not in grown}
    assert all(mine[k] <= theirs[k] for k in grown)
    assert (loaded.key_codec, loaded.value_codec, loaded.seed) == (cache.key_codec, cache.value_codec, cache.seed)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    np.testing.assert_array_equal(loaded.decode_attention(1, seqs, q), cache.decode_attention(1, seqs, q))
    for s in seqs:
        for a, b in zip(loaded.read(s, 1), cache.read(s, 1)):
            np.testing.assert_array_equal(a, b)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(kvq.Error):
        kvq.KVCache.load(path)
    with pytest.raises(kvq.Error):
        kvq.KVCache.load(tmp_path / "missing.kvq")


def test_threads_share_a_cache(rng):
    """Calls release the GIL and take turns on one cache: appends and attention from several threads give what
    they give one after another."""
    cache, seqs, _ = filled_cache(rng, [100, 100, 100, 100], key_codec="int4", value_codec="int4")
    q = rng.standard_normal((4, 4, 64)).astype(np.float32)
    before = cache.decode_attention(1, seqs, q)
    extra = cache.add_sequence()
    keys, values = tokens(rng, 1, 2, 64)
    results, errors = [], []

    def attend():
        try:
            for _ in range(20):
                results.append(cache.decode_attention(1, seqs, q))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    def grow():
        try:
            for _ in range(200):
                cache.append(extra, 1, keys, values)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=attend) for _ in range(3)] + [threading.Thread(target=grow)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.length(extra, 1) == 200
    for r in results:
        np.testing.assert_array_equal(r, before)


def test_bad_input_raises_clear_errors(rng):
    cache, (seq,), _ = filled_cache(rng, [10])
    keys, values = tokens(rng, 3, 2, 64)
    with pytest.raises(TypeError, match="keys: expected a float32 array, got float64"):
        cache.append(seq, 1, keys.astype(np.float64), values)
    with pytest.raises(kvq.Error, match=r"values: expected shape \[n=3, n_kv_heads=2, head_dim=64\], got \[3, 1, 64\]"):
        cache.append(seq, 1, keys, values[:, :1].copy())
    with pytest.raises(TypeError, match="C-contiguous"):
        cache.append(seq, 1, keys.transpose(1, 0, 2), values.transpose(1, 0, 2))
    bad = values.copy()
    bad[2, 1, 5] = np.nan
    with pytest.raises(kvq.Error, match="value of token 2"):
        cache.append(seq, 1, keys, bad)
    assert cache.length(seq, 1) == 10, "a failed append modifies nothing"
    with pytest.raises(kvq.Error, match="no sequence with id 99"):
        cache.append(99, 1, keys, values)
    with pytest.raises(kvq.Error, match="layer 5 out of range"):
        cache.append(seq, 5, keys, values)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    with pytest.raises(kvq.Error, match=r"q: expected shape \[len\(seqs\)=2"):
        cache.decode_attention(1, [seq, seq], q)
    with pytest.raises(kvq.Error, match="no sequence with id 7"):
        cache.decode_attention(1, [7], q)
    with pytest.raises(kvq.Error):
        cache.decode_attention(1, [seq], q[:, :3].copy())  # 3 query heads over 2 kv heads
    q_nan = q.copy()
    q_nan[0, 2, 9] = np.inf
    with pytest.raises(kvq.Error, match="query"):
        cache.decode_attention(1, [seq], q_nan)
    with pytest.raises(TypeError, match="out: expected a float32 array"):
        cache.decode_attention(1, [seq], q, out=np.zeros(q.shape))
    with pytest.raises(kvq.Error, match="out: shares memory with q"):
        cache.decode_attention(1, [seq], q, out=q)
    with pytest.raises(TypeError, match="out: expected a writable array"):
        cache.decode_attention(1, [seq], q, out="no array")
    with pytest.raises(kvq.Error, match="prefill_attention: positions"):
        cache.prefill_attention(1, seq, 8, q.repeat(5, axis=0))
    with pytest.raises(kvq.Error, match="unknown codec|nosuch"):
        kvq.KVCache(1, 1, 64, capacity_pages=1, key_codec="nosuch")
    with pytest.raises(kvq.Error, match="block_tokens = 32"):
        kvq.KVCache(1, 1, 64, capacity_pages=1, block_tokens=32)
    with pytest.raises(TypeError):
        kvq.KVCache(1, 1, 64)  # capacity_pages is required
    small = kvq.KVCache(1, 1, 64, capacity_pages=1)
    s = small.add_sequence()
    k, v = tokens(rng, 128, 1, 64)
    with pytest.raises(kvq.Error, match="pool exhausted"):
        small.append(s, 0, k, v)


def test_decode_plan_runs_equal_decode_attention_as_sequences_grow(rng):
    # One plan for every step: each run attends the sequences as they are then, bit for bit decode_attention's.
    cache, seqs, _ = filled_cache(rng, [0, 63, 200], key_codec="int4", value_codec="kivi:2")
    plan = cache.decode_plan(1, seqs, 8, window=100)
    for _ in range(5):
        for seq in seqs:
            keys, values = tokens(rng, 1, 2, 64, True)
            cache.append(seq, 1, keys, values)
        q = rng.standard_normal((3, 8, 64)).astype(np.float32)
        want = cache.decode_attention(1, seqs, q, window=100)
        assert np.array_equal(plan.run(q), want)
        out = np.empty_like(q)
        assert plan.run(q, out=out) is out and np.array_equal(out, want)
    with pytest.raises(ValueError, match="query heads"):
        plan.run(rng.standard_normal((3, 4, 64)).astype(np.float32))
    with pytest.raises(kvq.Error, match="kv heads"):
        cache.decode_plan(1, seqs, 3)
