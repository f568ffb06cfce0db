"""kvq.load_calibration: a calibration file written here in kvq calibrate's format (calibration_files.py) reads
back field for field; damaged or foreign files raise kvq.Error. And KVCache.load_layer_state, which starts a layer
from a file's trained states."""

import numpy as np
import pytest

import kvq
from calibration_files import CalibrationFile, Layer


def trained_states(rng, spec: str, n_layers: int, layer: int, d: int = 64) -> tuple[bytes, bytes]:
    """(key state, value state) of `spec` trained on random vectors as layer `layer` of a seed-0 cache."""
    cache = kvq.KVCache(n_layers, 1, d, capacity_pages=1, key_codec=spec, value_codec=spec)
    x = rng.standard_normal((512, d)).astype(np.float32)
    cache.train_layer(layer, x, x[::-1].copy())
    return cache.layer_state(layer)


def test_round_trip(tmp_path, rng):
    key_state, value_state = trained_states(rng, "vecinfer:8/4", 3, 2)
    file = CalibrationFile([Layer("int4", "kivi:2"), Layer("int8", "turbo_mse:3", centered=True),
                            Layer("vecinfer:8/4", "vecinfer:8/4", key_state=key_state, value_state=value_state)],
                           architecture="qwen2", channel_layout="rope_adjacent_pairs", budget_bits=3.5,
                           block_tokens=128, calibration_tokens=1000, sink_tokens=2, predicted_kld=0.25,
                           model_crc32c=0xDEADBEEF)
    c = kvq.load_calibration(file.write(tmp_path / "model.calib"))
    assert isinstance(c, kvq.Calibration)
    assert (c.architecture, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == ("qwen2", 3, 4, 2, 64)
    assert (c.model_crc32c, c.channel_layout) == (0xDEADBEEF, "rope_adjacent_pairs")
    assert (c.budget_bits, c.block_tokens, c.calibration_tokens, c.sink_tokens) == (3.5, 128, 1000, 2)
    assert c.predicted_kld == 0.25
    layers = c.layers
    assert [(l.key_codec, l.value_codec, l.center_keys) for l in layers] == [
        ("int4", "kivi:2", False), ("int8", "turbo_mse:3", True), ("vecinfer:8/4", "vecinfer:8/4", False)]
    assert [(l.key_state, l.value_state) for l in layers] == [(b"", b""), (b"", b""), (key_state, value_state)]
    assert all(isinstance(l, kvq.LayerCodecs) for l in layers)
    assert "trained" in repr(layers[2]) and "centered" in repr(layers[1])
    with pytest.raises(AttributeError):
        c.block_tokens = 64  # read-only


def test_damaged_and_foreign_files_raise(tmp_path):
    path = CalibrationFile([Layer("int4", "int4")] * 2).write(tmp_path / "good.calib")
    kvq.load_calibration(path)
    text = open(path).read()
    corrupt = tmp_path / "corrupt.calib"
    corrupt.write_text(text.replace("layer 1 int4 int4", "layer 1 int8 int4"))
    with pytest.raises(kvq.Error, match="corrupt"):
        kvq.load_calibration(corrupt)
    truncated = tmp_path / "truncated.calib"
    truncated.write_text(text[:len(text) // 2])
    with pytest.raises(kvq.Error, match="truncated"):
        kvq.load_calibration(truncated)
    with pytest.raises(kvq.Error, match="not a regular file"):
        kvq.load_calibration(tmp_path / "missing.calib")
    other = tmp_path / "other.txt"
    other.write_text("hello\n")
    with pytest.raises(kvq.Error, match="not a kvq calibration file"):
        kvq.load_calibration(other)
    with pytest.raises(kvq.Error, match="int5"):
        kvq.load_calibration(CalibrationFile([Layer("int5", "int4")]).write(tmp_path / "spec.calib"))
    with pytest.raises(kvq.Error, match="refuses"):  # a state of the wrong size, with a valid checksum
        kvq.load_calibration(CalibrationFile([Layer("vecinfer:8/4", "int4", key_state=b"\x01\x02")])
                             .write(tmp_path / "state.calib"))
    with pytest.raises(ValueError):  # kvq.Error is a ValueError
        kvq.load_calibration(corrupt)


def test_load_layer_state_starts_a_layer_trained(rng):
    key_state, value_state = trained_states(rng, "vecinfer:8/4", 2, 1)
    cache = kvq.KVCache(2, 2, 64, capacity_pages=8, key_codec="vecinfer:8/4", value_codec="vecinfer:8/4")
    assert not cache.ready(1)
    cache.load_layer_state(1, key_state, value_state)
    assert cache.ready(1) and not cache.ready(0)
    assert cache.layer_state(1) == (key_state, value_state)
    with pytest.raises(kvq.Error):
        cache.load_layer_state(0, b"\x00" * 7, b"")
    assert cache.layer_state(0) == (b"", b"")  # a refused state changes nothing
    seq = cache.add_sequence()
    x = rng.standard_normal((64, 2, 64)).astype(np.float32)
    cache.append(seq, 1, x, x)  # a page encoded with the loaded codebooks
    with pytest.raises(kvq.Error, match="already holds encoded tokens"):
        cache.load_layer_state(1, key_state, value_state)
