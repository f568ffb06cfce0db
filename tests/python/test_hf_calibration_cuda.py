"""kvq.hf.KvqCache(config, calib=FILE) with the model on a CUDA device: the file's codecs, centering, trained states
and channel layout on the device cache, the same as on the CPU within float32 rounding, eager and replayed as a CUDA
graph; a codec pair without a CUDA decode kernel is refused at the first forward. Skipped where torch or kvq has no
CUDA device (CI)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvq  # noqa: E402
import kvq.hf  # noqa: E402

if not torch.cuda.is_available() or not kvq.cuda_available():
    pytest.skip(f"no CUDA device for kvq.hf ({kvq.cuda_unavailable_reason() or 'torch sees no GPU'})",
                allow_module_level=True)

from calibration_files import CalibrationFile, Layer  # noqa: E402
from hf_models import tiny_model  # noqa: E402
from test_hf import greedy, prompt, relative_error  # noqa: E402
from test_hf_calibration import D, model_keys, trained_vecinfer  # noqa: E402
from test_hf_cuda import graph_greedy, on_cuda  # noqa: E402


def calibrated_file(model, seed, path) -> str:
    """Layer 0 vecinfer trained on the model's keys, layer 1 centered int4, layer 2 kivi:4 / int4, in GGUF llama's
    layout (keys and queries permuted on the device too)."""
    keys, values = model_keys(model, prompt(seed + 1, 1, 256), 0)
    states = trained_vecinfer(keys.reshape(-1, D), values.reshape(-1, D), 3, 0)
    return CalibrationFile([Layer("vecinfer:8/4", "vecinfer:8/4", key_state=states[0], value_state=states[1]),
                            Layer("int4", "int4", centered=True), Layer("kivi:4", "int4")],
                           channel_layout="rope_adjacent_pairs", sink_tokens=2).write(path)


def test_calibrated_cache_on_the_device_agrees_with_the_cpu(tmp_path, seed):
    cpu = tiny_model("llama", seed)
    gpu = on_cuda(tiny_model("llama", seed))
    path = calibrated_file(cpu, seed, tmp_path / "m.calib")
    ids = prompt(seed, 2, 150)
    with torch.no_grad():
        on_cpu, tokens = greedy(cpu, ids, kvq.hf.KvqCache(cpu.config, calib=path), 16)
        cache = kvq.hf.KvqCache(gpu.config, calib=path)
        on_gpu, _ = greedy(gpu, ids.cuda(), cache, 16, follow=tokens.cuda())
    assert relative_error(on_gpu.cpu(), on_cpu) < 1e-3
    store = cache.layers[0].store
    assert store.cache.device == "cuda:0"
    layer = kvq.load_calibration(path).layers[0]
    assert store.cache.layer_state(0) == (layer.key_state, layer.value_state)


def test_calibrated_decode_graph_follows_the_eager_steps(tmp_path, seed):
    model = on_cuda(tiny_model("llama", seed))
    path = calibrated_file(tiny_model("llama", seed), seed, tmp_path / "m.calib")
    ids = prompt(seed, 2, 140).cuda()
    with torch.no_grad():
        ref_logits, ref_tokens = greedy(model, ids, kvq.hf.KvqCache(model.config, calib=path, max_tokens=256), 40)
        logits, tokens, _ = graph_greedy(model, ids, kvq.hf.KvqCache(model.config, calib=path, max_tokens=256), 40)
    assert relative_error(logits, ref_logits) < 1e-4
    assert torch.equal(tokens, ref_tokens)


def test_a_pair_without_a_device_kernel_is_refused(tmp_path, seed):
    # turbo_prod:3 keys with kivi:2 values: a pair no build compiles a CUDA decode kernel for.
    model = on_cuda(tiny_model("llama", seed))
    path = CalibrationFile([Layer("int4", "int4"), Layer("turbo_prod:3", "kivi:2"),
                            Layer("int4", "int4")]).write(tmp_path / "m.calib")
    cache = kvq.hf.KvqCache(model.config, calib=path)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="layer 1's codecs 'turbo_prod:3' / 'kivi:2'"):
        model(input_ids=prompt(seed, 1, 20).cuda(), past_key_values=cache, use_cache=True)
