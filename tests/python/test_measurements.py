"""kvq.distortion and kvq.attention_error: the C++ measurements (tests/turbo_codecs_test.cpp,
tests/attention_error_test.cpp) reached from Python, with the same expectations."""

import math

import pytest

import kvq


def test_distortion_of_turbo_mse_matches_the_paper(seed):
    r = kvq.distortion("turbo_mse:2", dim=128, n=2000, seed=seed, block_tokens=1)
    assert set(r) == {"codec", "dim", "n", "bits_per_element", "mse", "ip_bias", "ip_bias_stderr", "ip_mse_d"}
    assert (r["codec"], r["dim"], r["n"]) == ("turbo_mse:2", 128, 2000)
    assert r["mse"] == pytest.approx(0.1160, rel=0.03)
    assert 4.0**-2 <= r["mse"] <= math.sqrt(3) * math.pi / 2 * 4.0**-2
    assert r["ip_bias_stderr"] > 0


def test_attention_error_grows_with_fewer_bits(seed):
    def measure(k, v):
        return kvq.attention_error(k, v, dim=64, ctx=300, q_heads=4, kv_heads=2, queries=3, seed=seed)

    exact, r8, r4, v4 = measure("f32", "f32"), measure("int8", "int8"), measure("int4", "int4"), measure("f32", "int4")
    assert set(exact) == {"key_codec", "value_codec", "bits_k", "bits_v", "rel_err_mean", "rel_err_max",
                          "weights_tv"}
    assert exact["rel_err_max"] < 1e-5 and exact["weights_tv"] < 1e-9 and exact["bits_k"] == 32.0
    assert r8["rel_err_mean"] > 1e-5
    assert r4["rel_err_mean"] > 3 * r8["rel_err_mean"]
    assert r4["rel_err_mean"] <= r4["rel_err_max"]
    assert v4["weights_tv"] == 0.0 and v4["rel_err_mean"] > 0.0


def test_bad_options_raise():
    with pytest.raises(kvq.Error):
        kvq.attention_error(ctx=0)
    with pytest.raises(kvq.Error):
        kvq.attention_error(q_heads=6, kv_heads=4)
    with pytest.raises(kvq.Error, match="int5"):
        kvq.attention_error("int5")
    with pytest.raises(kvq.Error, match="role"):
        kvq.distortion("int4", role="both")
