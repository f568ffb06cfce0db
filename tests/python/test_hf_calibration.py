"""kvq.hf.KvqCache(config, calib=FILE): a calibration file's per-layer codecs, key centering, trained states, sink
tokens and page size reach the layers' kvq caches; the file is checked against the model; keys and queries reach kvq
in the file's channel layout. Files are written here (calibration_files.py) for the tiny random models."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvq  # noqa: E402
import kvq.hf  # noqa: E402
from calibration_files import CalibrationFile, Layer  # noqa: E402
from hf_models import tiny_model  # noqa: E402
from kvq.hf.channels import key_order  # noqa: E402
from test_hf import greedy, prompt, relative_error  # noqa: E402

DynamicCache = transformers.DynamicCache
D = 64


def layer_of(cache, layer: int):
    """(kvq.KVCache, its sequence of row 0) holding `layer` of a used KvqCache."""
    store = cache.layers[layer].store
    return store.cache, store.seqs[0]


def trained_vecinfer(keys: np.ndarray, values: np.ndarray, n_layers: int, layer: int) -> tuple[bytes, bytes]:
    """vecinfer:8/4 states trained on [n, d] keys and values as layer `layer` of a seed-0 cache (kvq calibrate's)."""
    cache = kvq.KVCache(n_layers, 1, D, capacity_pages=1, key_codec="vecinfer:8/4", value_codec="vecinfer:8/4")
    cache.train_layer(layer, np.ascontiguousarray(keys, np.float32), np.ascontiguousarray(values, np.float32))
    return cache.layer_state(layer)


def model_keys(model, ids, layer: int, then=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of `layer` for row 0, [n, kv heads, d] each, from a DynamicCache: the prompt `ids` in
    one forward, then the tokens `then` ([1, steps]) one per forward, as greedy() feeds them (the same shapes, so
    the same float32 results)."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        for t in range(0 if then is None else then.shape[1]):
            model(input_ids=then[:, t:t + 1], past_key_values=cache, use_cache=True)
    return (cache.layers[layer].keys[0].transpose(0, 1).contiguous(),
            cache.layers[layer].values[0].transpose(0, 1).contiguous())


def test_per_layer_codecs_equal_the_explicit_cache(tmp_path, seed):
    # Codecs without training: the file's per-layer pairs are the same caches as the explicit lists, so the logits
    # are equal bit for bit.
    model = tiny_model("llama", seed)
    keys, values = ["int4", "kivi:2", "f16"], ["kivi:2", "turbo_mse:3", "int8"]
    path = CalibrationFile([Layer(k, v) for k, v in zip(keys, values)]).write(tmp_path / "m.calib")
    ids = prompt(seed, 2, 150)
    with torch.no_grad():
        ref, tokens = greedy(model, ids, kvq.hf.KvqCache(model.config, keys, values), 12)
        for calib in (path, kvq.load_calibration(path)):
            logits, _ = greedy(model, ids, kvq.hf.KvqCache(model.config, calib=calib), 12, follow=tokens)
            assert torch.equal(logits, ref)


def test_sink_tokens_block_tokens_and_centering_come_from_the_file(tmp_path, seed):
    model = tiny_model("qwen2", seed)
    path = CalibrationFile([Layer("int4", "int4", centered=True)] * 3, architecture="qwen2", sink_tokens=3,
                           block_tokens=128).write(tmp_path / "m.calib")
    ids = prompt(seed, 1, 300)
    with torch.no_grad():
        explicit = kvq.hf.KvqCache(model.config, "int4", "int4", center_keys=True, sink_tokens=3, block_tokens=128,
                                   prefill="cache")
        ref, tokens = greedy(model, ids, explicit, 6)
        cache = kvq.hf.KvqCache(model.config, calib=path, prefill="cache")
        logits, _ = greedy(model, ids, cache, 6, follow=tokens)
    assert torch.equal(logits, ref)
    kv, _ = layer_of(cache, 0)
    assert (kv.sink_tokens, kv.block_tokens, kv.center_keys) == (3, 128, True)


def test_layers_sharing_a_pair_but_not_centering_get_their_own_caches(tmp_path, seed):
    # Layer 0 centered, layers 1 and 2 plain, all int4 / int4. With prefill="exact" every layer's prompt keys are the
    # model's own whatever the cache, so each layer's stored keys must equal those of a cache centered (or not) in
    # every layer.
    model = tiny_model("llama", seed)
    path = CalibrationFile([Layer("int4", "int4", centered=True), Layer("int4", "int4"),
                            Layer("int4", "int4")]).write(tmp_path / "m.calib")
    ids = prompt(seed, 1, 200)
    caches = {}
    with torch.no_grad():
        for name, kwargs in (("file", dict(calib=path)), ("centered", dict(center_keys=True)), ("plain", {})):
            caches[name] = kvq.hf.KvqCache(model.config, **kwargs)
            model(input_ids=ids, past_key_values=caches[name], use_cache=True)
    assert len(caches["file"]._stores) == 2

    def stored_keys(name, layer):
        cache, seq = layer_of(caches[name], layer)
        return cache.read(seq, layer)[0]

    assert np.array_equal(stored_keys("file", 0), stored_keys("centered", 0))
    assert not np.array_equal(stored_keys("centered", 0), stored_keys("plain", 0))  # centering shows
    for layer in (1, 2):
        assert np.array_equal(stored_keys("file", layer), stored_keys("plain", layer))


def test_trained_states_reach_the_layers(tmp_path, seed):
    # Layer 0 vecinfer with codebooks trained on the model's own keys and values of another prompt: layer 0's kvq
    # cache holds them and encodes with them (its tokens read back are those of a kvq.KVCache given the same states:
    # layer 0's keys and values are the model's own whatever the cache, its input being the embeddings), and other
    # codebooks give other logits.
    # Layer 2 has the same pair with its own states: one kvq cache holds both layers, each with its own codebooks.
    model = tiny_model("llama", seed)
    train_k, train_v = model_keys(model, prompt(seed + 1, 1, 256), 0)
    states = trained_vecinfer(train_k.reshape(-1, D), train_v.reshape(-1, D), 3, 0)
    other = trained_vecinfer(train_v.reshape(-1, D), train_k.reshape(-1, D), 3, 0)
    last = trained_vecinfer(train_k.reshape(-1, D)[::2], train_v.reshape(-1, D)[::2], 3, 2)
    files = {}
    for name, (ks, vs) in (("states", states), ("other", other)):
        files[name] = CalibrationFile([Layer("vecinfer:8/4", "vecinfer:8/4", key_state=ks, value_state=vs),
                                       Layer("int4", "int4"),
                                       Layer("vecinfer:8/4", "vecinfer:8/4", key_state=last[0], value_state=last[1])]
                                      ).write(tmp_path / f"{name}.calib")
    ids = prompt(seed, 1, 160)
    with torch.no_grad():
        cache = kvq.hf.KvqCache(model.config, calib=files["states"])
        logits, tokens = greedy(model, ids, cache, 6)
        other_logits, _ = greedy(model, ids, kvq.hf.KvqCache(model.config, calib=files["other"]), 6, follow=tokens)
    kv, seq = layer_of(cache, 0)
    assert layer_of(cache, 2)[0] is kv and len(cache._stores) == 2
    assert kv.layer_state(0) == states and kv.layer_state(2) == last and last != states
    assert relative_error(other_logits, logits) > 1e-4

    # The same keys and values through a kvq.KVCache started from the states, as the KvqCache appended them (the
    # prompt at once, then one token per step): the same tokens stored.
    keys, values = model_keys(model, ids, 0, then=tokens)
    expected = kvq.KVCache(3, 2, D, capacity_pages=8, key_codec="vecinfer:8/4", value_codec="vecinfer:8/4")
    expected.load_layer_state(0, *states)
    row = expected.add_sequence()
    for start, end in [(0, 160)] + [(t, t + 1) for t in range(160, keys.shape[0])]:
        expected.append(row, 0, keys[start:end].contiguous().numpy(), values[start:end].contiguous().numpy())
    got_k, got_v = kv.read(seq, 0)
    want_k, want_v = expected.read(row, 0)
    assert np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v)


def test_file_layout_reaches_kvq_and_attention_is_unchanged(tmp_path, seed):
    # A file in GGUF llama's layout (RoPE pairs adjacent): the keys kvq stores are transformers' keys permuted into
    # that layout (f32 keys: exactly; layer 0's keys are the model's own whatever the cache), through the prompt's
    # cache attention and the decode steps; queries are permuted alike, so the logits equal those of a cache in
    # transformers' own layout.
    model = tiny_model("llama", seed)
    layers = [Layer("f32", "f32")] * 3
    pairs = CalibrationFile(layers, channel_layout="rope_adjacent_pairs").write(tmp_path / "pairs.calib")
    halves = CalibrationFile(layers, channel_layout="rope_halves").write(tmp_path / "halves.calib")
    ids = prompt(seed, 1, 150)
    with torch.no_grad():
        cache = kvq.hf.KvqCache(model.config, calib=pairs, prefill="cache")
        logits, tokens = greedy(model, ids, cache, 6)
        same, _ = greedy(model, ids, kvq.hf.KvqCache(model.config, calib=halves, prefill="cache"), 6, follow=tokens)
    assert relative_error(logits, same) < 1e-5
    order = key_order("rope_adjacent_pairs", D)
    assert order[:4] == [0, D // 2, 1, D // 2 + 1]
    keys, values = model_keys(model, ids, 0, then=tokens)
    kv, seq = layer_of(cache, 0)
    stored_k, stored_v = kv.read(seq, 0)
    assert np.array_equal(stored_k, keys[..., order].contiguous().numpy())
    assert np.array_equal(stored_v, values.contiguous().numpy())
    assert not np.allclose(stored_k, keys.contiguous().numpy(), rtol=1e-3, atol=1e-3)


def test_layout_matters_to_grouped_codecs(tmp_path, seed):
    # int4:32 quantizes groups of 32 channels with one scale: the same keys in another channel order fall into other
    # groups, so the adjacent-pairs file stores other keys than the halves file (each read back in its own layout).
    model = tiny_model("llama", seed)
    ids = prompt(seed, 1, 130)
    stored = {}
    for layout in ("rope_adjacent_pairs", "rope_halves"):
        path = CalibrationFile([Layer("int4:32", "int4")] * 3, channel_layout=layout).write(tmp_path / "k.calib")
        cache = kvq.hf.KvqCache(model.config, calib=path)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        kv, seq = layer_of(cache, 1)
        keys = kv.read(seq, 1)[0]
        order = key_order(layout, D)
        stored[layout] = keys if order is None else keys[..., np.argsort(order)]  # back in transformers' order
    assert not np.array_equal(stored["rope_adjacent_pairs"], stored["rope_halves"])


@pytest.mark.parametrize("kind, architecture", [("qwen2", "qwen2"), ("gemma3", "gemma3")])
def test_other_architectures(tmp_path, seed, kind, architecture):
    model = tiny_model(kind, seed)
    path = CalibrationFile([Layer("int4", "int4")] * 3, architecture=architecture).write(tmp_path / "m.calib")
    with torch.no_grad():
        greedy(model, prompt(seed, 1, 70), kvq.hf.KvqCache(model.config, calib=path), 2)


def test_a_file_for_another_model_raises(tmp_path, seed):
    config = tiny_model("llama", seed).config
    three = [Layer("int4", "int4")] * 3
    cases = [(CalibrationFile(three[:2]), "layer count is 2, the model's 3"),
             (CalibrationFile(three, heads=8), "query head count is 8, the model's 4"),
             (CalibrationFile(three, kv_heads=1), "kv head count is 1, the model's 2"),
             (CalibrationFile(three, head_dim=128), "head dimension is 128, the model's 64"),
             (CalibrationFile(three, architecture="qwen2"), "architecture is 'qwen2', the model's type 'llama'"),
             (CalibrationFile(three, architecture="gemma3"), "'gemma3', the model's type 'llama'"),
             (CalibrationFile(three, architecture="phi3"), "architecture 'phi3'"),
             (CalibrationFile(three, channel_layout="rope_sideways"), "channel layout 'rope_sideways'")]
    for i, (file, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            kvq.hf.KvqCache(config, calib=file.write(tmp_path / f"{i}.calib"))
    llama2c = CalibrationFile(three, architecture="llama2.c", channel_layout="rope_adjacent_pairs")
    kvq.hf.KvqCache(config, calib=llama2c.write(tmp_path / "llama2c.calib"))
    corrupt = tmp_path / "corrupt.calib"
    corrupt.write_text(CalibrationFile(three).text().replace("heads 4", "heads 5"))
    with pytest.raises(kvq.Error, match="corrupt"):
        kvq.hf.KvqCache(config, calib=corrupt)


def test_arguments_that_contradict_the_file_raise(tmp_path, seed):
    config = tiny_model("llama", seed).config
    states = trained_vecinfer(np.random.default_rng(seed).standard_normal((300, D)),
                              np.random.default_rng(seed + 1).standard_normal((300, D)), 3, 0)
    path = CalibrationFile([Layer("vecinfer:8/4", "vecinfer:8/4", key_state=states[0], value_state=states[1]),
                            Layer("int4", "kivi:2", centered=True), Layer("int8", "int4")],
                           sink_tokens=1).write(tmp_path / "m.calib")
    for kwargs, message in ((dict(key_codec="int4"), "key_codec='int4' contradicts"),
                            (dict(value_codec=["vecinfer:8/4", "kivi:2", "int8"]), "value_codec=.* contradicts"),
                            (dict(block_tokens=128), "block_tokens=128 contradicts the calibration's 64"),
                            (dict(sink_tokens=0), "sink_tokens=0 contradicts the calibration's 1"),
                            (dict(center_keys=True), "stores layer 0's keys plain"),
                            (dict(center_keys=False), "centers layer 1's keys"),
                            (dict(seed=3), "seed=3 with a calibration holding trained codec states")):
        with pytest.raises(ValueError, match=message):
            kvq.hf.KvqCache(config, calib=path, **kwargs)
    # What agrees with the file is accepted, and the file's trained codecs need no training.
    kvq.hf.KvqCache(config, ["vecinfer:8/4", "int4", "int8"], ["vecinfer:8/4", "kivi:2", "int4"], calib=path,
                    block_tokens=64, sink_tokens=1)
    untrained = CalibrationFile([Layer("vecinfer:8/4", "int4")] * 3).write(tmp_path / "untrained.calib")
    with pytest.raises(NotImplementedError, match="layer 0's key codec 'vecinfer:8/4' needs training"):
        kvq.hf.KvqCache(config, calib=untrained)


def test_cache_prefill_with_sink_tokens_attends_as_decoding_does(seed):
    # prefill="cache" in chunks attends as a token-by-token run also where the first tokens go to the sinks: the
    # chunks must stop before each append that encodes a page, counting the sinks. The model in float64, as in
    # test_hf.py's test without sinks (the sinks' f16 rounding would turn float32 noise into whole steps).
    model = tiny_model("llama", seed).double()
    ids = prompt(seed, 1, 150)
    with torch.no_grad():
        cache = kvq.hf.KvqCache(model.config, "int4", "int4", prefill="cache", sink_tokens=5)
        chunked = torch.cat([model(input_ids=ids[:, i:i + 50], past_key_values=cache, use_cache=True).logits
                             for i in range(0, 150, 50)], dim=1)
        cache = kvq.hf.KvqCache(model.config, "int4", "int4", prefill="cache", sink_tokens=5)
        single = torch.cat([model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits
                            for i in range(150)], dim=1)
    assert relative_error(chunked, single) < 1e-7
