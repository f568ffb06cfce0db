"""kvq.KVCache on a CUDA device against the same cache on the CPU (tests/gpu/decode_attention_test.cpp,
append_test.cpp): decode attention on the device equals the CPU cache's over the same contents within the GPU tests'
bound (1e-3 of sum_t p_t ||v_t||, plus fp32 score rounding), for caches copied from the CPU and for caches appended
to on the device from CUDA tensors; appends on the device hold what the CPU cache holds; to("cpu") round-trips; bad
input raises clear errors. The tests that need a GPU skip, naming the reason, where torch or kvq has no CUDA device;
what a machine without one says, and what the device argument accepts, are checked there."""

import numpy as np
import pytest

import kvq
from kvq._device import stream_handle
from reference import Attention, tokens

try:
    import torch
except ImportError:
    torch = None


def gpu_missing():
    """Why the GPU tests cannot run here, or None."""
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    if not kvq.cuda_available():
        return "kvq has no CUDA device: " + kvq.cuda_unavailable_reason()
    return None


GPU_MISSING = gpu_missing()
needs_gpu = pytest.mark.skipif(GPU_MISSING is not None, reason=str(GPU_MISSING))

# tests/gpu/decode_attention_test.cpp's bound for the device kernels, against the reference and the CPU kernels.
GPU_TOL = 1e-3
# Codec pairs with a CUDA decode kernel in the default build (src/cuda/decode_pairs.cmake).
PAIRS = [("f16", "f16"), ("int8", "int8"), ("int4", "int4"), ("kivi:2", "kivi:2"), ("turbo_mse:3", "turbo_mse:3"),
         ("int8", "int4")]
D, HEADS, LAYER = 128, 2, 1  # d a power of two: the default Hadamard rotation, whose device appends are bit-exact


def cuda(a):
    """A NumPy array as a new C-contiguous float32 tensor on CUDA device 0."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to("cuda:0")


def chunks(n, sizes=(37, 1, 100)):
    """[start, stop) of consecutive chunks of n tokens, their sizes cycling through `sizes`."""
    start, i = 0, 0
    while start < n:
        stop = min(n, start + sizes[i % len(sizes)])
        yield start, stop
        start, i = stop, i + 1


def new_cache(cls, rng, lengths, key_codec, value_codec, residual=0, **kw):
    pages = 2 * sum(n // 64 + 1 for n in lengths) + 4
    return cls(2, HEADS, D, capacity_pages=pages, key_codec=key_codec, value_codec=value_codec,
               residual_tokens=residual, seed=int(rng.integers(2**32)), **kw)


def cpu_cache(rng, lengths, key_codec, value_codec, residual=0, **kw):
    """A CPU cache holding one sequence per length in layer LAYER, appended in chunks; with its sequence ids."""
    cache = new_cache(kvq.KVCache, rng, lengths, key_codec, value_codec, residual, **kw)
    seqs = []
    for n in lengths:
        seqs.append(cache.add_sequence())
        keys, values = tokens(rng, n, HEADS, D)
        for start, stop in chunks(n):
            cache.append(seqs[-1], LAYER, keys[start:stop], values[start:stop])
    return cache, seqs


def reference(cpu, seqs, q, scale=None, window=0):
    """float64 attention of q [B, Hq, D] over the CPU cache's decoded tokens (the last `window` of them, if not 0),
    with the bounds of Attention."""
    B, Hq, _ = q.shape
    group = Hq // HEADS
    ref = Attention(B * Hq, D)
    for b, s in enumerate(seqs):
        keys, values = cpu.read(s, LAYER)
        seen = slice(-window if window else 0, None)
        for j in range(Hq):
            ref.row(b * Hq + j, q[b, j], keys[seen, j // group], values[seen, j // group], scale or 1 / np.sqrt(D))
    return ref


def expect_device_matches_cpu(cpu, seqs, q, got, scale=None, window=0):
    """The device's output `got` (a CUDA tensor) against the float64 reference and the CPU cache's kernels."""
    assert got.is_cuda and got.dtype == torch.float32 and tuple(got.shape) == q.shape
    got = got.cpu().numpy()
    assert np.isfinite(got).all()
    ref = reference(cpu, seqs, q, scale, window)
    assert ref.worst(got, tol=GPU_TOL) <= 1.0
    want = cpu.decode_attention(LAYER, seqs, q, scale=scale, window=window)
    assert ref.worst(got, tol=GPU_TOL, want=want) <= 1.0


def expect_same_contents(a, b, seqs):
    """Two caches hold the same tokens, decoded, in every sequence."""
    for s in seqs:
        assert a.length(s, LAYER) == b.length(s, LAYER)
        for x, y in zip(a.read(s, LAYER), b.read(s, LAYER)):
            np.testing.assert_array_equal(x, y)


@needs_gpu
@pytest.mark.parametrize("key_codec,value_codec", PAIRS)
def test_decode_attention_of_a_copied_cache_equals_the_cpu_cache(rng, key_codec, value_codec):
    for group, residual, lengths in [(1, 0, [1, 63, 0, 700]), (4, 64, [130, 5])]:
        cpu, seqs = cpu_cache(rng, lengths, key_codec, value_codec, residual)
        dev = cpu.to("cuda")
        q = rng.standard_normal((len(seqs), HEADS * group, D)).astype(np.float32)
        got = dev.decode_attention(LAYER, seqs, cuda(q))
        expect_device_matches_cpu(cpu, seqs, q, got)
        for b, n in enumerate(lengths):
            assert n > 0 or not got[b].any(), "a sequence without tokens gives zeros"


@needs_gpu
@pytest.mark.parametrize("key_codec,value_codec", PAIRS)
def test_appends_on_the_device_hold_what_the_cpu_cache_holds(rng, key_codec, value_codec):
    """The same tokens in the same chunks, to a CPU cache and to a device cache with the same seed: from CUDA tensors
    (append_device) and, every third chunk, from NumPy arrays (uploaded)."""
    # Centered keys: bit-exact on the device for the quantized key codecs (append_test.cpp, CenteredKeysBytes).
    for group, residual, center in [(4, 0, False), (2, 64, key_codec != "f16")]:
        lengths = [300, 1, 64]
        seed = int(rng.integers(2**32))
        config = dict(capacity_pages=32, key_codec=key_codec, value_codec=value_codec, residual_tokens=residual,
                      seed=seed, center_keys=center)
        cpu, dev = kvq.KVCache(2, HEADS, D, **config), kvq.KVCache(2, HEADS, D, device="cuda", **config)
        seqs = []
        for n in lengths:
            seqs.append(cpu.add_sequence())
            assert dev.add_sequence() == seqs[-1]
            keys, values = tokens(rng, n, HEADS, D)
            for i, (start, stop) in enumerate(chunks(n)):
                k, v = keys[start:stop], values[start:stop]
                cpu.append(seqs[-1], LAYER, k, v)
                dev.append(seqs[-1], LAYER, *((k, v) if i % 3 == 2 else (cuda(k), cuda(v))))
        assert dev.sequences == seqs and [dev.length(s, LAYER) for s in seqs] == lengths
        expect_same_contents(dev.to("cpu"), cpu, seqs)
        q = rng.standard_normal((len(seqs), HEADS * group, D)).astype(np.float32)
        expect_device_matches_cpu(cpu, seqs, q, dev.decode_attention(LAYER, seqs, cuda(q)))


@needs_gpu
@pytest.mark.parametrize("sinks", [1, 4])
def test_sink_tokens_on_the_device_hold_and_attend_as_on_the_cpu(rng, sinks):
    """sink_tokens on a device cache: appends in chunks (sequences shorter than the sinks included) hold what the CPU
    cache holds, the sinks in f16, and decode attention matches it, with a sliding window that hides them too."""
    lengths = [2, 3, 70, 200]
    config = dict(capacity_pages=32, key_codec="int4", value_codec="int4", seed=int(rng.integers(2**32)),
                  sink_tokens=sinks)
    cpu, dev = kvq.KVCache(2, HEADS, D, **config), kvq.KVCache(2, HEADS, D, device="cuda", **config)
    assert dev.sink_tokens == sinks
    seqs = []
    for n in lengths:
        seqs.append(cpu.add_sequence())
        assert dev.add_sequence() == seqs[-1]
        keys, values = tokens(rng, n, HEADS, D)
        for start, stop in chunks(n, (1, 2, 37)):
            cpu.append(seqs[-1], LAYER, keys[start:stop], values[start:stop])
            dev.append(seqs[-1], LAYER, cuda(keys[start:stop]), cuda(values[start:stop]))
    expect_same_contents(dev.to("cpu"), cpu, seqs)
    assert dev.memory()["sink_bytes"] == cpu.memory()["sink_bytes"] > 0
    q = rng.standard_normal((len(seqs), 4 * HEADS, D)).astype(np.float32)
    for window in (0, 2, 100):
        got = dev.decode_attention(LAYER, seqs, cuda(q), window=window)
        expect_device_matches_cpu(cpu, seqs, q, got, window=window)
    copied = cpu.to("cuda")
    expect_device_matches_cpu(cpu, seqs, q, copied.decode_attention(LAYER, seqs, cuda(q)))


@needs_gpu
@pytest.mark.parametrize("key_codec,value_codec", [("int4", "int4"), ("turbo_mse:3", "turbo_mse:3")])
def test_append_batch_of_one_token_per_sequence(rng, key_codec, value_codec):
    """Decode steps: one append_batch per step with a token for each sequence, against one CPU append per sequence;
    the steps cross page boundaries and fill empty sequences."""
    cpu, seqs = cpu_cache(rng, [0, 63, 64, 200], key_codec, value_codec, residual=64)
    dev = cpu.to("cuda")
    for _ in range(70):
        keys, values = tokens(rng, len(seqs), HEADS, D)
        dev.append_batch(seqs, LAYER, cuda(keys), cuda(values), [1] * len(seqs))
        for b, s in enumerate(seqs):
            cpu.append(s, LAYER, keys[b:b + 1], values[b:b + 1])
    assert [dev.length(s, LAYER) for s in seqs] == [70, 133, 134, 270]
    expect_same_contents(dev.to("cpu"), cpu, seqs)
    q = rng.standard_normal((len(seqs), 2 * HEADS, D)).astype(np.float32)
    expect_device_matches_cpu(cpu, seqs, q, dev.decode_attention(LAYER, seqs, cuda(q)))


@needs_gpu
def test_copy_to_the_cpu_round_trips_and_the_cache_state(rng):
    cpu, seqs = cpu_cache(rng, [0, 1, 64, 300, 5], "int8", "int4", residual=64, center_keys=True)
    cpu.remove_sequence(seqs.pop())  # the device cache goes on with the CPU cache's next id
    dev = cpu.to("cuda", capacity_pages=cpu.capacity_pages + 8)
    assert (dev.device, dev.capacity_pages, dev.sequences) == ("cuda:0", cpu.capacity_pages + 8, seqs)
    assert (dev.key_codec, dev.value_codec, dev.n_layers, dev.head_dim) == (cpu.key_codec, cpu.value_codec, 2, D)
    assert dev.attention_kernel(LAYER) == "cuda_int8_int4"
    used, have = dev.memory(), cpu.memory()
    for key in ("page_bytes", "pages_in_use", "encoded_bytes", "bits_per_element"):
        assert used[key] == have[key], key
    assert used["pages_capacity"] == cpu.capacity_pages + 8 == dev.free_pages + used["pages_in_use"]

    back = dev.to("cpu")
    assert back.capacity_pages == dev.capacity_pages and back.sequences == seqs
    expect_same_contents(back, cpu, seqs)
    assert dev.to("cpu", capacity_pages=cpu.capacity_pages).capacity_pages == cpu.capacity_pages

    dev_free, cpu_free = dev.free_pages, cpu.free_pages
    dev.remove_sequence(seqs[3])
    cpu.remove_sequence(seqs[3])
    assert dev.free_pages - dev_free == cpu.free_pages - cpu_free > 0 and dev.sequences == seqs[:3]
    assert dev.add_sequence() == cpu.add_sequence()


@needs_gpu
def test_out_scale_window_and_streams(rng):
    cpu, seqs = cpu_cache(rng, [200, 90], "int8", "int8", residual=64)
    dev = cpu.to("cuda")
    q = rng.standard_normal((2, 4, D)).astype(np.float32)
    qd = cuda(q)
    out = torch.full(q.shape, float("nan"), device="cuda:0")
    assert dev.decode_attention(LAYER, seqs, qd, scale=0.3, out=out) is out
    expect_device_matches_cpu(cpu, seqs, q, out, scale=0.3)

    # On a stream of the caller's: torch's current one, or named by the object or its handle.
    torch.cuda.synchronize()
    side = torch.cuda.Stream(device=0)
    with torch.cuda.stream(side):
        on_side = dev.decode_attention(LAYER, seqs, qd, scale=0.3)
    for got in (on_side, dev.decode_attention(LAYER, seqs, qd, scale=0.3, stream=side),
                dev.decode_attention(LAYER, seqs, qd, scale=0.3, stream=side.cuda_stream)):
        expect_device_matches_cpu(cpu, seqs, q, got, scale=0.3)

    # Sliding windows: the CPU's answer, or the library's refusal while the device has no kernel for them.
    try:
        got = dev.decode_attention(LAYER, seqs, qd, window=50)
    except kvq.Error as e:
        assert "window" in str(e)
    else:
        expect_device_matches_cpu(cpu, seqs, q, got, window=50)


@needs_gpu
def test_bad_input_raises_clear_errors(rng):
    cpu, (seq,) = cpu_cache(rng, [10], "int4", "int4")
    dev = cpu.to("cuda")
    keys, values = (cuda(a) for a in tokens(rng, 3, HEADS, D))
    q = cuda(rng.standard_normal((1, 4, D)))
    with pytest.raises(TypeError, match="q: expected an array on CUDA device 0, got one in CPU memory"):
        dev.decode_attention(LAYER, [seq], q.cpu())
    with pytest.raises(TypeError, match="q: expected a float32 array, got float64"):
        dev.decode_attention(LAYER, [seq], q.double())
    with pytest.raises(TypeError, match="q: expected a C-contiguous array"):
        dev.decode_attention(LAYER, [seq], q.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(TypeError, match="out: expected an array on CUDA device 0, got one in CPU memory"):
        dev.decode_attention(LAYER, [seq], q, out=torch.zeros(q.shape))
    with pytest.raises(TypeError, match="out: expected a writable array"):
        dev.decode_attention(LAYER, [seq], q, out="no array")
    with pytest.raises(kvq.Error, match="out: shares memory with q"):
        dev.decode_attention(LAYER, [seq], q, out=q)
    with pytest.raises(kvq.Error, match=r"q: expected shape \[len\(seqs\)=2"):
        dev.decode_attention(LAYER, [seq, seq], q)
    with pytest.raises(kvq.Error, match="no sequence with id 7"):
        dev.decode_attention(LAYER, [7], q)
    with pytest.raises(kvq.Error):
        dev.decode_attention(LAYER, [seq], q[:, :3].contiguous())  # 3 query heads over 2 kv heads
    with pytest.raises(TypeError, match="stream"):
        dev.decode_attention(LAYER, [seq], q, stream="default")

    with pytest.raises(TypeError, match="values: expected an array on CUDA device 0, got one in CPU memory"):
        dev.append(seq, LAYER, keys, values.cpu())
    with pytest.raises(TypeError, match="values: expected an array in CPU memory, got one on cuda"):
        dev.append(seq, LAYER, keys.cpu(), values)
    with pytest.raises(TypeError, match="keys: expected an array on CUDA device 0, got one in CPU memory"):
        dev.append_batch([seq], LAYER, keys.cpu(), values.cpu(), [3])
    with pytest.raises(kvq.Error, match=r"keys: expected shape \[sum\(n_tokens\)=2"):
        dev.append_batch([seq], LAYER, keys, values, [2])
    with pytest.raises(kvq.Error, match="no sequence with id 99"):
        dev.append(99, LAYER, keys, values)
    with pytest.raises(kvq.Error, match="16-byte aligned"):
        flat = torch.zeros(3 * HEADS * D + 1, device="cuda:0")
        dev.append(seq, LAYER, flat[1:].view(3, HEADS, D), values)
    bad = keys.clone()
    bad[2, 1, 5] = float("nan")
    fresh = dev.add_sequence()
    with pytest.raises(kvq.Error, match="key of token 2 head 1 channel 5"):
        dev.append(fresh, LAYER, bad, values)
    assert dev.length(fresh, LAYER) == 0 and dev.length(seq, LAYER) == 10, "a failed append modifies nothing"

    small = kvq.KVCache(1, HEADS, D, capacity_pages=1, key_codec="int4", value_codec="int4", device="cuda")
    s = small.add_sequence()
    k, v = (cuda(a) for a in tokens(rng, 200, HEADS, D))
    with pytest.raises(kvq.Error, match="pool exhausted"):
        small.append(s, 0, k, v)
    assert small.length(s, 0) == 0
    with pytest.raises(kvq.Error, match="no CUDA device 99"):
        kvq.KVCache(1, HEADS, D, capacity_pages=1, device="cuda:99")
    with pytest.raises(kvq.Error, match="no CUDA device 99"):
        cpu.to("cuda:99")
    with pytest.raises(kvq.Error, match="unknown codec|nosuch"):
        kvq.KVCache(1, HEADS, D, capacity_pages=1, key_codec="nosuch", device="cuda")
    if torch.cuda.device_count() > 1:
        with pytest.raises(TypeError, match="q: expected an array on CUDA device 0, got one on cuda \\(device 1\\)"):
            dev.decode_attention(LAYER, [seq], q.to("cuda:1"))


@pytest.mark.skipif(kvq.cuda_available(), reason="a CUDA device is present: the tests above use it")
def test_without_a_cuda_device_a_cuda_cache_says_why():
    reason = kvq.cuda_unavailable_reason()
    assert reason and not kvq.cuda_available()
    with pytest.raises(kvq.Error, match="no CUDA device") as raised:
        kvq.KVCache(1, 2, 64, capacity_pages=4, device="cuda")
    assert reason in str(raised.value)
    with pytest.raises(kvq.Error, match="no CUDA device") as raised:
        kvq.KVCache(1, 2, 64, capacity_pages=4).to("cuda:0")
    assert reason in str(raised.value)


def test_devices_by_name_and_what_runs_on_a_cpu_cache_only(rng):
    cpu, seqs = cpu_cache(rng, [70, 3], "int4", "int8", residual=64, center_keys=True)
    assert cpu.device == "cpu" and "device" not in repr(cpu)
    for bad in ("gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU"):
        with pytest.raises(kvq.Error, match='expected "cpu", "cuda" or "cuda:N"'):
            kvq.KVCache(1, 2, 64, capacity_pages=4, device=bad)
        with pytest.raises(kvq.Error, match='expected "cpu", "cuda" or "cuda:N"'):
            cpu.to(bad)
    copy = cpu.to("cpu", capacity_pages=cpu.capacity_pages + 3, threads=1)
    assert (copy.device, copy.capacity_pages, copy.sequences, copy.threads) == (
        "cpu", cpu.capacity_pages + 3, seqs, 1)
    expect_same_contents(copy, cpu, seqs)
    assert copy.add_sequence() == cpu.add_sequence()
    keys, values = tokens(rng, 2, HEADS, D)
    with pytest.raises(kvq.Error, match="append_batch: a cpu cache"):
        cpu.append_batch(seqs, LAYER, keys, values, [1, 1])
    with pytest.raises(kvq.Error, match="decode_step: a cpu cache"):
        cpu.decode_step(seqs, [LAYER], 4, scales=[None], windows=[0], max_tokens=200)


def test_stream_arguments():
    class TorchLikeStream:
        cuda_stream = 11

    assert stream_handle(7, 0) == 7
    assert stream_handle(TorchLikeStream(), 0) == 11
    for bad in ("0", 1.5, -1, True):
        with pytest.raises(TypeError, match="stream: expected None, a cudaStream_t"):
            stream_handle(bad, 0)


@needs_gpu
def test_decode_step_equals_append_then_decode(seed):
    # kvq.DecodeStep run eagerly: the same cache contents and attention (to float32 rounding of the splits) as
    # append_batch then decode_attention on a twin cache.
    gen = torch.Generator().manual_seed(seed)
    caches = [kvq.KVCache(2, 2, 64, capacity_pages=32, key_codec="int4", value_codec="int4", device="cuda")
              for _ in range(2)]
    seqs = [[c.add_sequence() for _ in range(3)] for c in caches]
    step = caches[1].decode_step(seqs[1], [0, 1], 4, scales=[None, 0.2], windows=[0, 50], max_tokens=200)
    for _ in range(70):
        for layer, (scale, window) in enumerate([(None, 0), (0.2, 50)]):
            k, v = (torch.randn(3, 2, 64, generator=gen).cuda() for _ in range(2))
            q = torch.randn(3, 4, 64, generator=gen).cuda()
            caches[0].append_batch(seqs[0], layer, k, v, [1, 1, 1])
            want = caches[0].decode_attention(layer, seqs[0], q, scale=scale, window=window)
            if layer == 0:
                step.prepare()
            got = torch.empty_like(q)
            step.run(layer, k, v, q, got)
            torch.cuda.synchronize()
            assert (got - want).abs().max() <= 1e-5 * max(1.0, float(want.abs().max()))
    step.check()
    assert step.steps == 70
    assert caches[1].length(seqs[1][2], 1) == 70
    with pytest.raises(kvq.Error, match="not one of the step's layers"):
        step.run(2, k, v, q, got)
    with pytest.raises(ValueError):
        step.run(0, k[:2], v, q, got)
