"""Decode speed of a whole model through transformers with each cache: DynamicCache + SDPA and kvq caches.

A Llama-3.1-8B-shaped model (32 layers, 32 query heads, 8 kv heads, d = 128, vocab 128256) built by transformers
from its config with random bf16 weights: no weights can be fetched on the GPU machine, and the speed of a step does
not depend on their values (the generated tokens mean nothing). Per cache and shape: the prompt (random tokens) in
one forward with logits_to_keep=1, then --steps timed single-token steps (CUDA-synchronized wall time per step,
after --warmup untimed steps). Prints a table; --json FILE writes one JSON object per run.

    python3 bench/gpu/e2e.py --shapes 1x4096 8x4096 1x32768 --json e2e.jsonl
    python3 bench/gpu/e2e.py --device cpu --tiny                  # a smoke test of the script on a small model
"""

import argparse
import json
import sys
import time

import torch
import transformers

import kvq.hf

LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                rope_theta=500000.0)
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
CACHES = ["dynamic", "f16/f16", "int8/int8", "int4/int4", "turbo_mse:3/turbo_mse:3", "kivi:2/kivi:2",
          "int4/turbo_mse:2"]


def build_model(shape: dict, device: str, dtype: torch.dtype):
    config = transformers.LlamaConfig(**shape)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="kvq", dtype=dtype)
    return model.eval()


def make_cache(name: str, model, max_tokens: int):
    if name == "dynamic":
        return transformers.DynamicCache(config=model.config)
    key, value = name.split("/")
    return kvq.hf.KvqCache(model.config, key, value, max_tokens=max_tokens)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(model, cache_name: str, batch: int, ctx: int, steps: int, warmup: int, device: str) -> dict:
    vocab = model.config.vocab_size
    generator = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, ctx), generator=generator).to(device)
    cache = make_cache(cache_name, model, ctx + steps + warmup + 1)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        synchronize(device)
        start = time.perf_counter()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        synchronize(device)
        prefill = time.perf_counter() - start
        token = out.logits[:, -1:].argmax(-1)
        times = []
        for step in range(warmup + steps):
            synchronize(device)
            start = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            synchronize(device)
            if step >= warmup:
                times.append(time.perf_counter() - start)
    times.sort()
    ms = 1e3 * times[len(times) // 2]
    row = {"cache": cache_name, "batch": batch, "ctx": ctx, "steps": steps, "prefill_s": prefill,
           "ms_per_step": ms, "tokens_per_s": batch * 1e3 / ms}
    if isinstance(cache, kvq.hf.KvqCache):
        memory = cache.memory()
        row["cache_bytes"] = memory["encoded_bytes"] + memory["residual_bytes"]
        row["bits_per_element"] = memory["bits_per_element"]
    if device.startswith("cuda"):
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del cache, out
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1x4096", "8x4096", "1x32768"], help="BATCHxCTX")
    parser.add_argument("--caches", nargs="+", default=CACHES, help="dynamic, or KEY/VALUE kvq codec specs")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a small model instead of the 8B shape")
    parser.add_argument("--json", help="append one JSON object per run to this file")
    args = parser.parse_args()
    shape = TINY if args.tiny else LLAMA_8B
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    start = time.perf_counter()
    model = build_model(shape, args.device, dtype)
    print(f"e2e: Llama-shaped model {shape['num_hidden_layers']} layers x {shape['hidden_size']}, random {dtype} "
          f"weights (the speed does not depend on their values; the tokens mean nothing), built in "
          f"{time.perf_counter() - start:.0f} s; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"kvq {kvq.__version__}", flush=True)
    print(f"{'cache':>26} {'batch':>5} {'ctx':>7} {'ms/step':>8} {'tok/s':>8} {'prefill s':>9} {'bits':>5} "
          f"{'peak GiB':>8}", flush=True)
    for shape_name in args.shapes:
        batch, ctx = (int(x) for x in shape_name.split("x"))
        for cache_name in args.caches:
            try:
                row = run(model, cache_name, batch, ctx, args.steps, args.warmup, args.device)
            except (torch.cuda.OutOfMemoryError, kvq.Error, NotImplementedError, RuntimeError) as e:
                row = {"cache": cache_name, "batch": batch, "ctx": ctx, "error": f"{type(e).__name__}: {e}"[:300]}
                print(f"{cache_name:>26} {batch:>5} {ctx:>7}  {row['error']}", flush=True)
            else:
                print(f"{cache_name:>26} {batch:>5} {ctx:>7} {row['ms_per_step']:>8.2f} {row['tokens_per_s']:>8.1f} "
                      f"{row['prefill_s']:>9.2f} {row.get('bits_per_element', 16):>5.2f} "
                      f"{row.get('peak_gib', 0):>8.1f}", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
