"""Decode speed and context capacity of a whole model through transformers, with each cache a user could pick.

A Llama-3.1-8B-shaped model (32 layers, 32 query heads, 8 kv heads, d = 128, vocab 128256) built by transformers
from its config with random bf16 weights: no weights can be fetched on the GPU machine, and the speed of a step does
not depend on their values (the generated tokens mean nothing). Caches (--caches):
  dynamic             transformers' DynamicCache, SDPA attention (what every user starts with)
  static-compile      transformers' StaticCache sized prompt + steps, model.forward compiled with
                      mode="reduce-overhead", fullgraph=True (its fastest documented path); prefill uncompiled
  quantized-quanto    transformers' QuantizedCache, int4, optimum-quanto backend
  quantized-hqq       the same with the HQQ backend (axis 1, as transformers' docs advise for it)
  kvq:KEY/VALUE       kvq.hf.KvqCache with those codecs; on CUDA its decode steps replay kvq.hf.DecodeGraph
                      where kvq has it (--no-graphs: the eager step)
  kvq:KEY/VALUE+compile  the same with the step torch.compile'd before its capture (DecodeGraph(compile=True)):
                      the compiler's fused norms, rotary embedding and activations around kvq's kernels
Per cache and shape (--shapes BATCHxCTX): random prompt tokens prefilled in chunks of --chunk tokens per row with
logits_to_keep=1 (timed apart), --warmup untimed steps, then --steps timed single-token greedy steps. A cell whose
cache cannot fit in the free GPU memory is recorded as such without allocating; an out-of-memory error is recorded
and the run goes on. --profile N: N more steps under torch.profiler, each kernel's device time summed by
what it does (weights GEMMs, attention, kvq's append, fused or other kernels), and the step's time outside any
kernel (launch gaps, host waits). Prints a table; --json FILE appends one JSON object per line: a "meta" object per call, a
"cell" per cache and shape, a "capacity" per cache (the largest batch at --capacity-ctx tokens, computed).

kvq on CUDA: kvq.hf has no device prefill attention yet (a prompt chunk after the first would attend token by
token), so there the first chunk goes through the model and the rest of the context is appended to each layer's
kvq cache as random keys and values ("prefill": "first chunk + synthetic" in the row; --kvq-prefill model forces
the model's own chunked prefill). Decode reads every token the same way whatever its values.

    python3 bench/gpu/e2e.py --shapes 1x4096 8x32768 --caches dynamic kvq:int4/int4 --json e2e.jsonl
    python3 bench/gpu/e2e.py --device cpu --tiny --shapes 2x256 --steps 4     # a smoke test on a small model
bench/gpu/e2e.sh runs the whole grid on the GPU machine in pieces that fit its 10-minute commands.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import statistics
import sys
import time

import torch
import transformers

import kvq
import kvq.hf

LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                rope_theta=500000.0)
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
# kivi:4 keys with int4 values: docs/quality.md's best pair at int4's 4.5 bits (+0.5-0.6 % against int4's +1 %);
# it has a CUDA kernel in the default build (src/cuda/decode_pairs.cmake).
CACHES = ["dynamic", "static-compile", "quantized-quanto", "quantized-hqq", "kvq:bf16/bf16", "kvq:int8/int8",
          "kvq:int4/int4", "kvq:turbo_mse:3/turbo_mse:3", "kvq:kivi:2/kivi:2", "kvq:kivi:4/int4"]
SHAPES = [f"{b}x{c}" for c in (4096, 32768, 131072) for b in (1, 8, 32)]
NOTE = ("random bf16 weights (float32 on the CPU): the speed of a step does not depend on their values; "
        "the generated tokens mean nothing")
QUANTIZED = {"quantized-quanto": dict(backend="quanto", nbits=4),
             "quantized-hqq": dict(backend="hqq", nbits=4, axis_key=1, axis_value=1)}
QUANTIZED_BITS = 4 + 2 * 16 / 64  # int4 codes with a bf16 scale and zero point per group of 64
MARGIN = 2 * 2**30  # free memory a cell leaves for the allocator's fragments and the libraries' workspaces


def log(message: str) -> None:
    print(f"e2e: {message}", file=sys.stderr, flush=True)


def is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def synchronize(device: str) -> None:
    if is_cuda(device):
        torch.cuda.synchronize()


COMPILED = "+compile"


def kvq_codecs(name: str) -> tuple[str, str]:
    """"kvq:KEY/VALUE[+compile]" -> (KEY, VALUE); a spec holds no "/" except vecinfer's, which kvq.hf refuses
    anyway."""
    key, value = name[len("kvq:"):].removesuffix(COMPILED).split("/")
    return key, value


def is_compiled(name: str) -> bool:
    """The cells whose decode step runs torch.compile'd code (which holds compiled graphs until reset)."""
    return name == "static-compile" or name.endswith(COMPILED)


def check_cache_name(name: str) -> None:
    if name in ("dynamic", "static-compile") or name in QUANTIZED:
        return
    if name.startswith("kvq:") and name.count("/") == 1:
        return
    raise SystemExit(f"e2e: unknown cache '{name}' (dynamic, static-compile, {', '.join(QUANTIZED)}, "
                     f"kvq:KEY/VALUE[{COMPILED}])")


def build_model(shape: dict, device: str, dtype: torch.dtype):
    config = transformers.LlamaConfig(**shape)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="kvq", dtype=dtype)
    return model.eval()


def cache_keyword(model) -> str:
    """The forward's cache argument: `cache` in newer transformers, which deprecate `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def bytes_per_token(name: str, config, dtype: torch.dtype) -> tuple[float, float]:
    """Bytes one token of one sequence takes in the cache over all layers, and the bytes per token that a forward
    allocates on top for a while: copies of one layer's cache (DynamicCache's torch.cat, the quantized caches'
    dequantized layer, and SDPA's keys and values repeated for GQA under a mask: prefill chunks after the first, every
    step of the static cache)."""
    layers, kv_heads, d = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    elements = layers * kv_heads * d  # of keys, and as many of values
    element_bytes = torch.finfo(dtype).bits / 8
    layer_bytes = 2 * kv_heads * d * element_bytes
    groups = config.num_attention_heads // kv_heads
    if name == "dynamic":
        return 2 * elements * element_bytes, (groups + 1) * layer_bytes
    if name == "static-compile":
        return 2 * elements * element_bytes, groups * layer_bytes
    if name in QUANTIZED:
        return 2 * elements * QUANTIZED_BITS / 8, (groups + 2) * layer_bytes
    key, value = kvq_codecs(name)
    bits = kvq.Codec(key, d, role="key").bits_per_element + kvq.Codec(value, d, role="value").bits_per_element
    return elements * bits / 8, 0.0


def prefill_bytes(config, rows: int, chunk: int, dtype: torch.dtype) -> float:
    """What a prefill forward of `chunk` tokens per row allocates besides the cache: the hidden states, q, k, v and
    the MLP's three intermediate activations of every token, in the model's dtype."""
    per_token = 4 * config.hidden_size + 2 * config.num_attention_heads * config.head_dim \
        + 3 * config.intermediate_size
    return rows * chunk * per_token * torch.finfo(dtype).bits / 8


def make_cache(name: str, model, tokens: int):
    if name == "dynamic":
        return transformers.DynamicCache(config=model.config)
    if name == "static-compile":
        return transformers.StaticCache(config=model.config, max_cache_len=tokens)
    if name in QUANTIZED:
        return transformers.QuantizedCache(config=model.config, **QUANTIZED[name])
    key, value = kvq_codecs(name)
    return kvq.hf.KvqCache(model.config, key, value, max_tokens=tokens)


def held_bytes(cache) -> int:
    """The bytes a cache holds now: kvq's pages and fp32 windows, or the tensors of transformers' layers."""
    if isinstance(cache, kvq.hf.KvqCache):
        memory = cache.memory()
        return int(memory["pool_bytes"] + memory["residual_bytes"])
    total = 0
    for layer in cache.layers:
        for attr in ("keys", "values", "_quantized_keys", "_quantized_values"):
            total += sum(t.numel() * t.element_size() for t in _tensors(getattr(layer, attr, None)))
    return total


def _tensors(x):
    """The plain tensors inside a cache attribute: a tensor, a quanto QTensor (its inner tensors), an HQQ (tensor,
    meta dict) pair."""
    if x is None:
        return []
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    if hasattr(x, "__tensor_flatten__"):
        names, _ = x.__tensor_flatten__()
        return [t for n in names for t in _tensors(getattr(x, n))]
    return [x] if isinstance(x, torch.Tensor) else []


def fill_kvq(cache, model, start: int, ctx: int, chunk: int, device: str) -> None:
    """Appends positions start..ctx of every row to each layer's kvq cache as random keys and values, `chunk` tokens
    at a time, and counts them as seen by the layer, as a prefill through the model would have."""
    config = model.config
    generator = torch.Generator(device=device).manual_seed(1)
    block = torch.randn(min(chunk, ctx - start), config.num_key_value_heads, config.head_dim, device=device,
                        generator=generator)  # [tokens, kv heads, d], float32: what kvq's caches append
    for layer in cache.layers:
        store = layer.store
        done = start
        while done < ctx:
            n = min(chunk, ctx - done)
            for seq in store.seqs:
                store.cache.append(seq, layer.layer_idx, block[:n], block[:n])
            done += n
        layer.seen += ctx - start


class Stepper:
    """One greedy decode step of the cell's cache: step(token [batch, 1], positions [batch, 1]) -> logits
    [batch, 1, vocab]; `path` says which way it runs."""

    def __init__(self, name: str, model, cache, device: str, graphs: bool):
        self.cache = cache
        self.keyword = cache_keyword(model)
        if name == "static-compile":
            self.path = "compiled"
            self.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        elif name.startswith("kvq:") and graphs and is_cuda(device) and hasattr(kvq.hf, "DecodeGraph"):
            compile = name.endswith(COMPILED)
            self.path = "graph+compile" if compile else "graph"
            self.graph = kvq.hf.DecodeGraph(model, cache, compile=compile)
        elif name.endswith(COMPILED):
            self.path = "compiled eager"
            self.forward = torch.compile(model.forward)
        else:
            self.path = "eager"
            self.forward = model.forward

    def __call__(self, token: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.path.startswith("graph"):
            return self.graph(token, positions)
        if self.path == "compiled":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs may be overwritten now
        out = self.forward(input_ids=token, position_ids=positions, use_cache=True, **{self.keyword: self.cache})
        return out.logits


def compiled_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def free_memory(device: str) -> int:
    gc.collect()
    if not is_cuda(device):
        return 0
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


_warm: set = set()


def warm_up(model, name: str, device: str) -> float:
    """A few tokens through a throw-away cache of this kind, once per process: what the first use costs (CUDA
    libraries' handles, optimum-quanto's extension built on the fly) stays out of the cell's prefill."""
    if name in _warm:
        return 0.0
    _warm.add(name)
    start = time.perf_counter()
    cache = make_cache(name, model, 40)
    keyword = cache_keyword(model)
    with torch.no_grad():  # as generate() runs
        ids = torch.zeros(1, 32, dtype=torch.long, device=device)
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{keyword: cache})
        for _ in range(2):
            model(input_ids=ids[:, :1], use_cache=True, **{keyword: cache})
    synchronize(device)
    return time.perf_counter() - start


def run_cell(model, name: str, batch: int, ctx: int, args) -> dict:
    """Prefills one cache with `batch` rows of `ctx` random tokens and times the decode steps; returns the cell's
    row."""
    device, config, dtype = args.device, model.config, model.dtype
    tokens = ctx + args.warmup + args.steps + args.profile
    row = {"kind": "cell", "cache": name, "batch": batch, "ctx": ctx, "steps": args.steps}
    per_token, transient = bytes_per_token(name, config, dtype)
    chunk = min(args.chunk, ctx)
    need = batch * tokens * (per_token + transient) + prefill_bytes(config, batch, chunk, dtype)
    row["estimated_gib"] = need / 2**30
    if is_cuda(device):
        free = free_memory(device)
        if need + MARGIN > free:
            row.update(status="does not fit",
                       reason=f"does not fit (needs {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free)")
            return row
        torch.cuda.reset_peak_memory_stats()
    kvq_cache = name.startswith("kvq:")
    synthetic = kvq_cache and (args.kvq_prefill == "synthetic" or args.kvq_prefill == "auto" and is_cuda(device))
    if name in ("dynamic", "static-compile") or name in QUANTIZED:
        model.set_attn_implementation("sdpa")  # transformers' own attention, nothing of kvq on the way
    else:
        model.set_attn_implementation("kvq")
    generator = torch.Generator(device="cpu").manual_seed(batch * 1000003 + ctx)
    cache = stepper = logits = None
    try:
        row["first_use_s"] = warm_up(model, name, device)
        cache = make_cache(name, model, tokens)
        with torch.no_grad():  # as generate() runs
            model_tokens = chunk if synthetic else ctx
            synchronize(device)
            start = time.perf_counter()
            for first in range(0, model_tokens, chunk):
                n = min(chunk, model_tokens - first)
                ids = torch.randint(0, config.vocab_size, (batch, n), generator=generator).to(device)
                positions = torch.arange(first, first + n, device=device).expand(batch, n)
                logits = model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1,
                               **{cache_keyword(model): cache}).logits
                if model_tokens > chunk:
                    synchronize(device)
                    log(f"{name} {batch}x{ctx}: prefill {first + n}/{model_tokens} tokens, "
                        f"{time.perf_counter() - start:.1f} s")
            synchronize(device)
            row["prefill_s"] = time.perf_counter() - start
            row["prefill"] = "first chunk + synthetic" if synthetic and ctx > chunk else "model"
            row["prefill_tokens"] = model_tokens
            if synthetic and ctx > chunk:
                start = time.perf_counter()
                fill_kvq(cache, model, chunk, ctx, args.chunk, device)
                synchronize(device)
                row["fill_s"] = time.perf_counter() - start
            token = logits[:, -1:].argmax(-1)
            logits = None
            start = time.perf_counter()
            stepper = Stepper(name, model, cache, device, args.graphs)
            row["path"] = stepper.path
            if stepper.path.startswith("graph"):
                synchronize(device)
                row["graph_capture_s"] = time.perf_counter() - start
            positions = torch.arange(ctx, tokens, device=device)
            positions = positions.view(-1, 1, 1).expand(-1, batch, 1).contiguous()  # [step] -> [batch, 1]
            synchronize(device)
            start = time.perf_counter()
            for step in range(args.warmup):
                token = stepper(token, positions[step])[:, -1:].argmax(-1)
            synchronize(device)
            row["warmup_s"] = time.perf_counter() - start
            if is_compiled(name):
                row["compile_s"] = row["warmup_s"]
                graphs_before = compiled_graphs()
            timed = positions[args.warmup:args.warmup + args.steps]
            times = timed_steps(stepper, token, timed, device)
            if is_compiled(name):
                row["recompiles_in_timing"] = compiled_graphs() - graphs_before
            if args.profile:
                row["profile"] = profile_steps(stepper, token, positions[args.warmup + args.steps:], device)
        row.update(status="ok", ms_per_step_median=1e3 * statistics.median(times),
                   ms_per_step_mean=1e3 * statistics.fmean(times),
                   tokens_per_s=batch * len(times) / sum(times), cache_tokens=int(cache.get_seq_length()),
                   cache_bytes=held_bytes(cache),
                   bytes_per_token=per_token)
        if isinstance(cache, kvq.hf.KvqCache):
            memory = cache.memory()
            row["bits_per_element"] = memory["bits_per_element"]
            row["bytes_per_token"] = (memory["encoded_bytes"] + memory["residual_bytes"]) / (batch * tokens)
        if is_cuda(device):
            # kvq's device pages are allocated outside torch's allocator: added to its peak.
            outside = row["cache_bytes"] if isinstance(cache, kvq.hf.KvqCache) else 0
            row["peak_gib"] = (torch.cuda.max_memory_allocated() + outside) / 2**30
    except torch.OutOfMemoryError as e:
        row.update(status="out of memory", reason=f"out of memory: {str(e).splitlines()[0][:200]}")
    except Exception as e:  # noqa: BLE001 (a cache that cannot run is a row that says why)
        row.update(status="error", reason=f"{type(e).__name__}: {e}"[:400])
    finally:
        del cache, stepper, logits
        if is_compiled(name):
            torch.compiler.reset()  # compiled graphs (static-compile's CUDA graphs: a memory pool) hold their inputs
        free_memory(device)
    return row


def timed_steps(stepper: Stepper, token: torch.Tensor, positions: torch.Tensor, device: str) -> list[float]:
    """Seconds of each step. On CUDA, events between the steps and one synchronization at the end, so that the host
    may queue a step while the device runs the one before, as a decode loop does."""
    steps = positions.shape[0]
    if not is_cuda(device):
        times = []
        for step in range(steps):
            start = time.perf_counter()
            token = stepper(token, positions[step])[:, -1:].argmax(-1)
            times.append(time.perf_counter() - start)
        return times
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for step in range(steps):
        token = stepper(token, positions[step])[:, -1:].argmax(-1)
        events[step + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(steps)]


KERNEL_KINDS = (  # (what a kernel does, words of its name); the first match names it
    ("kvq attention", ("decode_split_kernel", "merge_kernel", "map_queries_kernel")),
    ("kvq append", ("encode_pages_kernel", "key_mean_kernel", "gather_window_kernel", "move_window_kernel",
                    "place_page_ids_kernel")),
    ("weights GEMMs", ("gemm", "gemv", "splitk", "cutlass", "nvjet", "xmma", "cublas")),
    ("torch attention", ("flash", "fmha", "attention", "sdpa")),
    ("fused (torch.compile)", ("triton",)),
)


def kernel_kind(name: str) -> str:
    lower = name.lower()
    for kind, words in KERNEL_KINDS:
        if any(word in lower for word in words):
            return kind
    return "other kernels"


def profile_steps(stepper: Stepper, token: torch.Tensor, positions: torch.Tensor, device: str) -> dict:
    """Runs positions.shape[0] more steps under torch.profiler: device milliseconds per step of each kind of kernel
    (kernel_kind), their sum and the kernels per step. The step's median time less that sum is the time no kernel
    ran (launches, host work, waits)."""
    if not is_cuda(device):
        return {}
    steps = positions.shape[0]
    synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for step in range(steps):
            token = stepper(token, positions[step])[:, -1:].argmax(-1)
        torch.cuda.synchronize()
    per_kind: dict[str, float] = {}
    others: dict[str, float] = {}
    kernels = 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = kernel_kind(event.name)
        ms = event.device_time_total / 1e3 / steps
        per_kind[kind] = per_kind.get(kind, 0.0) + ms
        if kind == "other kernels":
            others[event.name[:120]] = others.get(event.name[:120], 0.0) + ms
        kernels += 1
    return {"steps": steps, "ms_per_step": per_kind, "kernel_ms_per_step": sum(per_kind.values()),
            "kernels_per_step": kernels / steps, "other_kernels": dict(sorted(others.items(), key=lambda x: -x[1])[:8])}


def format_profile(row: dict) -> str:
    profile = row["profile"]
    kinds = sorted(profile["ms_per_step"].items(), key=lambda item: -item[1])
    outside = row["ms_per_step_median"] - profile["kernel_ms_per_step"]
    return (f"{'':>28} profile, ms per step: " + ", ".join(f"{kind} {ms:.2f}" for kind, ms in kinds)
            + f"; outside kernels {outside:.2f}; {profile['kernels_per_step']:.0f} kernels")


def capacity_row(name: str, model, ctx: int, args) -> dict:
    """The largest batch whose cache of ctx + warm-up + steps tokens per row fits beside the weights in the whole
    device memory (the machine's memory on the CPU), computed from the bytes per token (bytes_per_token) and
    MARGIN."""
    per_token, transient = bytes_per_token(name, model.config, model.dtype)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if is_cuda(args.device):
        total = torch.cuda.get_device_properties(0).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    tokens = ctx + args.warmup + args.steps
    room = total - weights - MARGIN
    return {"kind": "capacity", "cache": name, "ctx": ctx, "max_batch": max(int(room // (tokens * (per_token +
            transient))), 0), "bytes_per_token": per_token, "transient_bytes_per_token": transient,
            "weights_bytes": weights, "device_bytes": total, "how": "computed"}


def meta_row(model, args, build_s: float) -> dict:
    return {"kind": "meta", "time": time.strftime("%Y-%m-%d %H:%M:%S"), "device": args.device,
           "gpu": torch.cuda.get_device_name(0) if is_cuda(args.device) else None,
           "torch": torch.__version__, "transformers": transformers.__version__, "kvq": kvq.__version__,
           "model": "tiny Llama" if args.tiny else "Llama-3.1-8B shape", "config": TINY if args.tiny else LLAMA_8B,
           "dtype": str(model.dtype), "weights_note": NOTE, "steps": args.steps, "warmup": args.warmup,
           "chunk": args.chunk, "graphs": args.graphs, "kvq_decode_graph": hasattr(kvq.hf, "DecodeGraph"),
           "kvq_prefill": args.kvq_prefill, "model_build_s": build_s}


def done_cells(path: str | None) -> set:
    """(cache, batch, ctx) of the cells the JSON file already holds, for --resume: every outcome but an error, which
    a fixed install or a new kvq may cure."""
    if not path or not os.path.exists(path):
        return set()
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {(r["cache"], r["batch"], r["ctx"]) for r in rows if r.get("kind") == "cell" and r["status"] != "error"}


def parse_shape(text: str) -> tuple[int, int]:
    batch, ctx = text.lower().split("x")
    return int(batch), int(ctx)


def format_row(row: dict) -> str:
    head = f"{row['cache']:>28} {row['batch']:>5} {row['ctx']:>7}"
    if row["status"] != "ok":
        return f"{head}  {row['reason']}"
    return (f"{head} {row['ms_per_step_median']:>8.2f} {row['ms_per_step_mean']:>8.2f} {row['tokens_per_s']:>9.1f} "
            f"{row['prefill_s']:>9.2f} {_number(row.get('compile_s'), 9, 1)} {_number(row.get('peak_gib'), 8, 1)}  "
            f"{row['path']}"
            + (f", {row['prefill']}" if row["prefill"] != "model" else ""))


def _number(x: float | None, width: int, digits: int) -> str:
    return f"{x:>{width}.{digits}f}" if x is not None else " " * (width - 1) + "-"


HEADER = (f"{'cache':>28} {'batch':>5} {'ctx':>7} {'ms med':>8} {'ms mean':>8} {'tok/s':>9} {'prefill s':>9} "
          f"{'compile s':>9} {'peak GiB':>8}  path")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--caches", nargs="+", default=CACHES)
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="BATCHxCTX (default: {1,8,32} x "
                        "{4096,32768,131072})")
    parser.add_argument("--steps", type=int, default=128, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=4, help="untimed decode steps first (static-compile: its "
                        "compilation and CUDA-graph recording happen here)")
    parser.add_argument("--chunk", type=int, default=4096, help="prefill tokens per row and forward")
    parser.add_argument("--capacity-ctx", type=int, default=32768, help="context of the capacity rows")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-graphs", dest="graphs", action="store_false", help="kvq caches decode eagerly "
                        "even where kvq.hf.DecodeGraph exists")
    parser.add_argument("--kvq-prefill", choices=["auto", "model", "synthetic"], default="auto",
                        help="kvq caches: the whole prompt through the model, or the first chunk and random keys "
                        "and values after it (auto: synthetic on CUDA)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="N more steps per cell under "
                        "torch.profiler: device time per kind of kernel (CUDA only)")
    parser.add_argument("--tiny", action="store_true", help="a small model instead of the 8B shape")
    parser.add_argument("--json", help="append the rows to this file (JSON lines)")
    parser.add_argument("--resume", action="store_true", help="skip the cells the --json file already holds, "
                        "except those that ended in an error")
    parser.add_argument("--max-seconds", type=float, default=0, help="start no cell after this many seconds of "
                        "the run (0: no limit); what is left is listed on stderr")
    args = parser.parse_args(argv)
    if args.profile < 0:
        parser.error(f"--profile {args.profile}: the number of profiled steps must be >= 0")
    for name in args.caches:
        check_cache_name(name)
    args.shapes = [parse_shape(s) for s in args.shapes]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    begin = time.perf_counter()
    dtype = torch.bfloat16 if is_cuda(args.device) else torch.float32
    model = build_model(TINY if args.tiny else LLAMA_8B, args.device, dtype)
    meta = meta_row(model, args, time.perf_counter() - begin)
    print(f"e2e: {meta['model']} ({model.config.num_hidden_layers} layers x {model.config.hidden_size}), {NOTE}; "
          f"{meta['gpu'] or args.device}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"kvq {kvq.__version__}; {args.steps} steps after {args.warmup} warm-up steps", flush=True)
    rows = [meta]
    skip = done_cells(args.json) if args.resume else set()
    write(args.json, meta)
    print(HEADER, flush=True)
    left = []
    for batch, ctx in args.shapes:
        for name in args.caches:
            if (name, batch, ctx) in skip:
                continue
            if args.max_seconds and time.perf_counter() - begin > args.max_seconds:
                left.append(f"{name} {batch}x{ctx}")
                continue
            log(f"{name} {batch}x{ctx}: start at {time.perf_counter() - begin:.0f} s")
            row = run_cell(model, name, batch, ctx, args)
            print(format_row(row), flush=True)
            if row.get("profile"):
                print(format_profile(row), flush=True)
            rows.append(row)
            write(args.json, row)
    print(f"\nlargest batch at {args.capacity_ctx} tokens (computed: device memory - weights - "
          f"{MARGIN / 2**30:.0f} GiB, over bytes per sequence incl. a forward's transient copies)", flush=True)
    for name in args.caches:
        row = capacity_row(name, model, args.capacity_ctx, args)
        print(f"{name:>28} {row['max_batch']:>5}   {row['bytes_per_token'] / 1024:.1f} KiB/token", flush=True)
        write(args.json, row)
    if left:
        log(f"not run within --max-seconds {args.max_seconds:.0f}: {', '.join(left)}")
    log(f"done in {time.perf_counter() - begin:.0f} s")
    return 0


def write(path: str | None, row: dict) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
