"""DecodeGraph: a model's decode step with a KvqCache on CUDA, captured once as a CUDA graph and replayed.

An eager decode step of a transformers model costs tens of milliseconds of Python and kernel launches, far more
than reading the weights and the compressed cache. DecodeGraph captures one whole step (every layer's weights,
kvq's append and attention) with torch.cuda.graph and replays it: the step then costs what its kernels cost.
kvq's part of the graph reads every length, page and window from device tables (kvq.DecodeStep) that are
rewritten before each replay, so one capture serves every later step.

    cache = kvq.hf.KvqCache(model.config, "int4", "int4", max_tokens=prompt_len + new_tokens)
    out = model(input_ids=prompt, past_key_values=cache, logits_to_keep=1)  # the prefill, eager
    step = kvq.hf.DecodeGraph(model, cache)
    next_ids = out.logits[:, -1:].argmax(-1)
    for _ in range(new_tokens):
        logits = step(next_ids)                   # [batch, 1, vocab], overwritten by the next call
        next_ids = logits[:, -1:].argmax(-1)
    step.check()                                  # waits, and raises for a NaN or Inf a step appended

kvq.hf.generate(model, ..., past_key_values=cache) is model.generate() with its decode steps through a DecodeGraph.
"""

from __future__ import annotations

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from .cache import KvqCache


class DecodeGraph:
    """Single-token decode steps of `model` over `cache` (a KvqCache whose layers live on CUDA devices, the prompt
    already in it): the first call runs eagerly (warming up what the capture needs), the second captures the step
    and replays it, later calls only replay. Every row gets one new token per call; padding is not supported
    after the prefill. The cache must not be used otherwise (another forward, reset) while the DecodeGraph is.

    compile=True: the step is torch.compile'd before it is captured, so that the graph replays the compiler's fused
    kernels (norms, rotary embedding, activations) instead of the eager model's many small ones; kvq's attention and
    the cache's bookkeeping stay outside the compiled code. The first two calls then run the compiled step (the
    second compiles again once the step's position is known to change), the third captures."""

    def __init__(self, model, cache, forward=None, compile: bool = False):
        self.model = model
        self.forward = forward or model  # what runs a step: generate() hands the model's own forward
        if compile:
            self.forward = torch.compile(self.forward)
        self.eager_calls = 2 if compile else 1
        self.cache = cache
        self.graph: torch.cuda.CUDAGraph | None = None
        self.calls = 0
        self._stores = None
        self._steps: list = []

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: long [batch, 1] on the model's device; position_ids: long [batch, 1] (None: every row at the
        cache's length, right for batches without padding). Returns the step's logits [batch, 1, vocab]."""
        stores = self._check_cache(input_ids)
        if position_ids is None:
            position_ids = torch.full_like(input_ids, self.cache.get_seq_length())
        if self.calls < self.eager_calls:  # records each layer's attention scale and window, warms up kernels
            self.calls += 1
            return self._forward(input_ids, position_ids).logits
        if self.graph is None:
            self._capture(stores, input_ids, position_ids)
        else:
            self.ids.copy_(input_ids)
            self.positions.copy_(position_ids)
            self._prepare()
            for layer in self.cache.layers:
                layer.seen += 1
        self.graph.replay()
        self.calls += 1
        return self.logits

    def check(self) -> None:
        """Waits for the steps so far; raises kvq.Error for a NaN, Inf or unstorable value one of them appended."""
        for step in self._steps:
            step.check()

    def _check_cache(self, input_ids: torch.Tensor):
        stores = list(self.cache._stores.values())
        if not stores:
            raise RuntimeError("kvq.hf.DecodeGraph: the cache is empty: run the prompt through the model first")
        if self._stores is not None and stores != self._stores:
            raise RuntimeError("kvq.hf.DecodeGraph: the cache was reset or changed since the graph was made: make a "
                               "new DecodeGraph")
        for store in stores:
            if store.device.type != "cuda":
                raise NotImplementedError(f"kvq.hf.DecodeGraph: a layer's cache on '{store.device}': CUDA graphs "
                                          "need every layer on a CUDA device")
        if input_ids.dim() != 2 or input_ids.shape != (len(stores[0].seqs), 1):
            raise ValueError(f"kvq.hf.DecodeGraph: input_ids of shape {tuple(input_ids.shape)}; a step takes "
                             f"[{len(stores[0].seqs)}, 1]")
        return stores

    def _capture(self, stores, input_ids: torch.Tensor, position_ids: torch.Tensor) -> None:
        self._stores = stores
        text = self.model.config.get_text_config(decoder=True)
        n_q_heads = text.num_attention_heads
        for store in stores:
            layers = sorted(store.attention_args)
            if not layers:
                raise RuntimeError("kvq.hf.DecodeGraph: no decode step has run through the cache's layers yet")
            scales = [store.attention_args[layer][0] for layer in layers]
            windows = [store.attention_args[layer][1] for layer in layers]
            store.graph_step = store.cache.decode_step(store.seqs, layers, n_q_heads, scales=scales,
                                                       windows=windows, max_tokens=self.cache.options.max_tokens)
            self._steps.append(store.graph_step)
        self.ids = input_ids.clone()
        self.positions = position_ids.clone()
        self._prepare()
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                out = self._forward(self.ids, self.positions)
        finally:
            for store in stores:
                store.graph_step = None
        self.logits = out.logits

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor):
        # Compiled: kvq's Python splits every attention layer's code at the cache's update and at the attention
        # call; dynamo compiles the pieces after them once per layer (the layer's index is a constant in them), so
        # its limit of compilations per piece must cover the layers (eager forwards are not affected).
        limit = max(torch._dynamo.config.recompile_limit, 2 * len(self.cache.layers) + 8)
        with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=limit):
            return self.forward(input_ids=input_ids, position_ids=position_ids, past_key_values=self.cache,
                                use_cache=True, logits_to_keep=1)

    def _prepare(self) -> None:
        for step in self._steps:
            step.prepare()


def generate(model, *args, past_key_values: KvqCache | None = None, cache: KvqCache | None = None,
             compile: bool = False, **kwargs):
    """model.generate(*args, past_key_values=..., **kwargs) with every single-token decode step replayed from a
    DecodeGraph: the same arguments and result. The cache (past_key_values, or `cache` as newer transformers name
    it): a KvqCache whose layers live on CUDA devices. The prompt, and any step that asks for more than the logits
    (attentions, hidden states, embeddings as input), run the model as it is. compile: DecodeGraph's (the decode
    step torch.compile'd before its capture). Raises kvq.Error after generating where a step appended a NaN or
    Inf."""
    given = {"past_key_values": past_key_values} if cache is None else {"cache": cache}
    kv = next(iter(given.values()))
    if not isinstance(kv, KvqCache) or (cache is not None and past_key_values is not None):
        raise TypeError("kvq.hf.generate: give one kvq.hf.KvqCache as past_key_values (or cache), got "
                        f"{type(kv).__name__}")
    own = model.__dict__.get("forward")  # an instance's own forward (accelerate's hooks) comes back afterwards
    original = model.forward
    graph = DecodeGraph(model, kv, forward=original, compile=compile)

    def forward(*a, **kw):
        ids = kw.get("input_ids")
        step_cache = kw.get("past_key_values", kw.get("cache"))
        if (a or ids is None or ids.shape[1] != 1 or step_cache is not kv or not kv._stores
                or kw.get("output_attentions") or kw.get("output_hidden_states")
                or kw.get("inputs_embeds") is not None):
            return original(*a, **kw)
        return CausalLMOutputWithPast(logits=graph(ids, kw.get("position_ids")), past_key_values=kv)

    model.forward = forward
    try:
        out = model.generate(*args, **given, **kwargs)
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own
    graph.check()
    return out
