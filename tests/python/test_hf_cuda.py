"""kvq.hf with the model on a CUDA device: the cache is a kvq.DeviceKVCache and decode attention runs the CUDA
kernels on the device's pages. Skipped where torch or kvq has no CUDA device (CI)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvq  # noqa: E402
import kvq.hf  # noqa: E402
from hf_models import tiny_model  # noqa: E402
from test_hf import greedy, prompt, relative_error  # noqa: E402

if not torch.cuda.is_available() or not kvq.cuda_available():
    pytest.skip(f"no CUDA device for kvq.hf ({kvq.cuda_unavailable_reason() or 'torch sees no GPU'})",
                allow_module_level=True)


def on_cuda(model, dtype=torch.float32):
    return model.to(device="cuda", dtype=dtype)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_f16_cache_on_the_device_follows_dynamic_cache(kind, seed):
    model = on_cuda(tiny_model(kind, seed))
    ids = prompt(seed, 2, 140).cuda()
    with torch.no_grad():
        ref_logits, ref_tokens = greedy(model, ids, transformers.DynamicCache(config=model.config), 24)
        cache = kvq.hf.KvqCache(model.config, "f16", "f16")
        logits, tokens = greedy(model, ids, cache, 24)
    assert isinstance(next(iter(cache._stores.values())).cache, kvq.DeviceKVCache)
    assert relative_error(logits, ref_logits) < 1e-3
    assert torch.equal(tokens, ref_tokens)


def test_device_and_cpu_caches_agree(seed):
    # The same model on the CPU and on the device with an int4 cache: the same codes, attention within float32
    # rounding of each other (the kernels differ in summation order).
    cpu = tiny_model("llama", seed)
    gpu = on_cuda(tiny_model("llama", seed))
    ids = prompt(seed, 2, 150)
    with torch.no_grad():
        on_cpu, _ = greedy(cpu, ids, kvq.hf.KvqCache(cpu.config, "int4", "int4"), 16)
        on_gpu, _ = greedy(gpu, ids.cuda(), kvq.hf.KvqCache(gpu.config, "int4", "int4"), 16)
    assert relative_error(on_gpu.cpu(), on_cpu) < 1e-3


def test_padded_batch_and_bf16_generate_on_the_device(seed):
    model = on_cuda(tiny_model("llama", seed), torch.bfloat16)
    lengths = [137, 70]
    ids = prompt(seed, 2, 137).cuda()
    mask = torch.ones_like(ids)
    ids[1, :67] = 0
    mask[1, :67] = 0
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                             past_key_values=kvq.hf.KvqCache(model.config, "int4", "int4"))
        alone = model.generate(input_ids=ids[1:, 67:], max_new_tokens=20, do_sample=False,
                               past_key_values=kvq.hf.KvqCache(model.config, "int4", "int4"))
    assert out.shape == (2, 157)
    assert lengths[1] + 20 == alone.shape[1]
    # bf16 activations: the greedy tokens of the padded row and of the row alone agree on most steps.
    assert (out[1, 137:] == alone[0, 70:]).float().mean() >= 0.8


def test_sliding_window_on_the_device(seed):
    model = on_cuda(tiny_model("gemma3", seed, sliding_window=100))
    ids = prompt(seed, 1, 150).cuda()
    with torch.no_grad():
        ref, _ = greedy(model, ids, transformers.DynamicCache(config=model.config), 30)
        try:
            logits, _ = greedy(model, ids, kvq.hf.KvqCache(model.config, "f16", "f16"), 30)
        except kvq.Error as e:
            assert "window" in str(e)
            pytest.xfail(f"the device refuses sliding windows: {e}")
    assert relative_error(logits, ref) < 1e-3


def test_layers_on_two_devices(seed):
    # accelerate's device_map over two GPUs: each layer's pages live on its layer's device (one kvq.DeviceKVCache
    # per device), and the logits equal those of the model wholly on the first GPU. (A "cpu" entry in a device_map
    # means weights offloaded to the CPU and run on a GPU, so one GPU cannot show this.)
    accelerate = pytest.importorskip("accelerate")
    if torch.cuda.device_count() < 2:
        pytest.skip("a model spread over devices needs two GPUs")
    whole = on_cuda(tiny_model("llama", seed))
    split = accelerate.dispatch_model(tiny_model("llama", seed), device_map={
        "model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 1,
        "model.layers.2": 1, "model.norm": 1, "lm_head": 1})
    ids = prompt(seed, 1, 150).cuda()
    with torch.no_grad():
        ref, _ = greedy(whole, ids, kvq.hf.KvqCache(whole.config, "int4", "int4"), 12)
        cache = kvq.hf.KvqCache(split.config, "int4", "int4")
        logits, _ = greedy(split, ids, cache, 12)
    devices = sorted(store.cache.device for store in cache._stores.values())
    assert devices == [0, 1]
    assert relative_error(logits.cpu(), ref.cpu()) < 1e-3
