"""kvq.Codec against plain NumPy references of what each codec promises (tests/int_codecs_test.cpp,
tests/float_codecs_test.cpp, tests/turbo_codecs_test.cpp): exact float formats, the int codecs' half-step bound,
turbo_mse's distortion; blocks, bytes and trained state through Python."""

import math

import numpy as np
import pytest

import kvq
from reference import key_like

T = 64


def to_bf16(x):
    """float32 rounded to bfloat16, nearest even (src/core/half.hpp), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("n", [1, 17, 64, 150])
def test_float_codecs_store_the_rounded_values(rng, n):
    x = key_like(rng, n, 128)
    expected = {"f32": x, "f16": x.astype(np.float16).astype(np.float32), "bf16": to_bf16(x)}
    for spec, want in expected.items():
        codec = kvq.Codec(spec, 128)
        blocks = codec.encode(x)
        assert blocks.dtype == np.uint8 and blocks.shape == (math.ceil(n / T), codec.block_bytes)
        got = codec.decode(blocks, n)
        assert got.dtype == np.float32 and got.shape == (n, 128)
        np.testing.assert_array_equal(got, want, err_msg=spec)


def test_float_codecs_reject_values_beyond_their_format():
    x = np.ones((4, 16), dtype=np.float32)
    x[2, 5] = 65520.0
    with pytest.raises(kvq.Error, match="token 2 channel 5.*beyond the format's range"):
        kvq.Codec("f16", 16, block_tokens=4).encode(x)
    kvq.Codec("bf16", 16, block_tokens=4).encode(x)


def int_bound_violation(x, xhat, bits, group):
    """The int codecs without rotation (int_codecs_test.cpp): each group of `group` channels of a token has the scale
    s = max|x| / qmax, stored in fp16 (one fp16 step of it), and every element decodes within s / 2 of itself
    (relative slack 1e-5, plus 1e-6 |x| for the codec's fp32 arithmetic). Returns the largest error / bound."""
    qmax = 127 if bits == 8 else 7
    x = x.astype(np.float64)
    n, d = x.shape
    amax = np.abs(x).reshape(n, d // group, group).max(axis=2)
    s = amax / qmax
    s_stored = s + np.ldexp(s, -10) + 2.0**-24 + 1e-6 * s
    bound = np.repeat(s_stored, group, axis=1) / 2 * (1 + 1e-5) + 1e-6 * np.abs(x)
    return float((np.abs(x - xhat) / bound).max())


@pytest.mark.parametrize("spec,bits,group",
                         [("int4", 4, 32), ("int4:16", 4, 16), ("int4:64", 4, 64), ("int8", 8, 32),
                          ("int8:16", 8, 16), ("int8:64", 8, 64)])
@pytest.mark.parametrize("role", ["key", "value"])
def test_int_codecs_stay_within_half_a_step(rng, spec, bits, group, role):
    for d in (64, 128):
        x = key_like(rng, 150, d) if role == "key" else rng.standard_normal((150, d)).astype(np.float32)
        codec = kvq.Codec(spec + ",rot=identity", d, seed=int(rng.integers(2**32)), role=role)
        for n in (1, 17, 64, 150):
            xhat = codec.decode(codec.encode(x[:n]), n)
            assert int_bound_violation(x[:n], xhat, bits, group) <= 1.0, (spec, role, d, n)


def test_int_codecs_bits_per_element():
    for spec, bits in [("int4", 4.5), ("int4:16", 5.0), ("int4:64", 4.25), ("int8", 8.5), ("int8:16", 9.0),
                       ("int8:64", 8.25)]:
        codec = kvq.Codec(spec, 128)
        assert codec.bits_per_element == bits
        assert codec.block_bytes == bits * 128 * T / 8


@pytest.mark.parametrize("bits,paper", [(1, 0.3609), (2, 0.1160), (3, 0.0340), (4, 0.0093)])
def test_turbo_mse_distortion_matches_the_paper(rng, bits, paper):
    """Mean squared error on unit vectors at d = 128 (turbo_codecs_test.cpp: within 3% of the paper's value and
    between 4^-b and sqrt(3) pi / 2 4^-b), computed here in float64 from encode and decode."""
    x = rng.standard_normal((2000, 128))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    codec = kvq.Codec(f"turbo_mse:{bits}", 128, seed=int(rng.integers(2**32)))
    mse = float(((codec.decode(codec.encode(x), len(x)).astype(np.float64) - x) ** 2).sum(axis=1).mean())
    assert mse == pytest.approx(paper, rel=0.03)
    assert 4.0**-bits <= mse <= math.sqrt(3) * math.pi / 2 * 4.0**-bits


def test_decode_takes_bytes_and_the_first_tokens_of_longer_input(rng):
    x = rng.standard_normal((100, 64)).astype(np.float32)
    codec = kvq.Codec("int8", 64)
    blocks = codec.encode(x)
    full = codec.decode(blocks, 100)
    np.testing.assert_array_equal(codec.decode(blocks.tobytes(), 100), full)
    np.testing.assert_array_equal(codec.decode(blocks, 30), full[:30])
    assert codec.encode(x[:0]).shape == (0, codec.block_bytes)
    assert codec.decode(blocks[:0], 0).shape == (0, 64)
    with pytest.raises(kvq.Error, match="100 tokens need 2 blocks"):
        codec.decode(blocks[:1], 100)
    with pytest.raises(kvq.Error, match="not whole blocks"):
        codec.decode(blocks.reshape(-1)[:-1], 1)
    with pytest.raises(TypeError, match="uint8"):
        codec.decode(blocks.view(np.int8), 100)


def test_trained_state_round_trips(rng):
    d = 64
    train = key_like(rng, 4096, d)
    x = key_like(rng, 64, d)
    codec = kvq.Codec("vecinfer:8/4", d, seed=3)
    assert codec.needs_training and not codec.trained
    with pytest.raises(kvq.Error, match="train"):
        codec.encode(x)
    codec.train(train)
    assert codec.trained
    state = codec.state()
    assert isinstance(state, bytes) and len(state) > 0
    copy = kvq.Codec("vecinfer:8/4", d, seed=3)
    copy.load_state(state)
    np.testing.assert_array_equal(copy.encode(x), codec.encode(x))
    with pytest.raises(kvq.Error):
        kvq.Codec("f16", d).load_state(state)


def test_properties_and_names():
    codec = kvq.Codec("int4:16,rot=identity", 96, seed=5, block_tokens=32, role="value")
    assert (codec.dim, codec.block_tokens, codec.role, codec.space_dim) == (96, 32, "value", 96)
    assert codec.spec.startswith("int4:16")
    assert not codec.needs_training and codec.trained and codec.state() == b""
    assert "int4:16" in repr(codec)
    assert {"f16", "int4", "turbo_mse", "qjl", "vecinfer"} <= set(kvq.codec_names())


def test_bad_specs_and_arguments_raise_clear_errors(rng):
    with pytest.raises(kvq.Error, match="nosuch"):
        kvq.Codec("nosuch", 64)
    with pytest.raises(kvq.Error, match="head dimension"):
        kvq.Codec("int4", 60)
    with pytest.raises(kvq.Error, match="role must be 'key' or 'value'"):
        kvq.Codec("int4", 64, role="query")
    codec = kvq.Codec("int4", 64)
    x = rng.standard_normal((10, 64)).astype(np.float32)
    with pytest.raises(TypeError, match="x: expected a float32 array, got float64"):
        codec.encode(x.astype(np.float64))
    with pytest.raises(kvq.Error, match=r"x: expected shape \[n, dim=64\], got \[10, 32\]"):
        codec.encode(x[:, :32].copy())
    with pytest.raises(TypeError, match="C-contiguous"):
        codec.encode(np.asfortranarray(x))
    with pytest.raises(TypeError, match="C-contiguous"):
        codec.encode(np.repeat(x, 2, axis=1)[:, ::2])
    misaligned = np.zeros(10 * 64 * 4 + 1, dtype=np.uint8)[1:].view(np.float32).reshape(10, 64)
    with pytest.raises(TypeError, match="aligned"):
        codec.encode(misaligned)
    with pytest.raises(kvq.Error, match="tokens need"):
        codec.decode(codec.encode(x[:1]), 2**64 - 1)
    x[3, 7] = np.nan
    with pytest.raises(kvq.Error, match="row 3 channel 7 is -?nan"):
        codec.encode(x)
    assert issubclass(kvq.Error, ValueError)
