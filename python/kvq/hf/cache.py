"""KvqCache: a transformers `Cache` whose layers keep their keys and values in kvq's compressed pages.

Each model layer is a `KvqLayer`; its tokens live in one kvq cache (a `Store`) per (device, codec pair), shared by
the layers with that pair on that device, one kvq sequence per batch row. The layer's `update` only hands the new
keys and values on: kvq's attention function (attention.py) appends them, leaving out padding, and attends."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .. import _kvq
from . import attention
from .store import Store


@dataclass(frozen=True)
class Options:
    block_tokens: int
    residual_tokens: int
    seed: int
    center_keys: bool
    sink_tokens: int
    threads: int
    prefill: str
    max_tokens: int


class KvqLayer(CacheLayerMixin):
    """One model layer's cache: the kvq layer `layer_idx` of its Store. `keys`/`values` stay None: the tokens are
    in the Store's pages, not in tensors."""

    is_compileable = False
    is_sliding = False

    def __init__(self, parent: "KvqCache", layer_idx: int, key_codec: str, value_codec: str):
        super().__init__()
        self.parent = parent
        self.layer_idx = layer_idx
        self.key_codec = key_codec
        self.value_codec = value_codec
        self.store: Store | None = None
        self.seen = 0  # positions the model has passed through this layer, padding included
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.store = self.parent._store(key_states.device, self.key_codec, self.value_codec, key_states.shape[0])
        self.is_initialized = True

    # Run as Python under torch.compile: the hand-over to the attention call below is bookkeeping on Python objects
    # that a compiled graph must not freeze; the layers' tensor work around it still compiles.
    @torch.compiler.disable
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != len(self.store.seqs):
            raise ValueError(f"kvq.hf: layer {self.layer_idx} holds a batch of {len(self.store.seqs)} rows, the "
                             f"model passed {key_states.shape[0]}")
        if self.pending is not None:
            raise RuntimeError(f"kvq.hf: layer {self.layer_idx}'s previous keys and values never reached kvq's "
                               "attention: load the model with attn_implementation='kvq' (import kvq.hf first) to "
                               "use a KvqCache")
        self.pending = (key_states, value_states)
        attention.hand_over(self)
        self.seen += key_states.shape[-2]
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.parent._drop_stores()

    def _forget(self) -> None:
        self.store = None
        self.seen = 0
        self.pending = None
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.store is not None and not torch.equal(beam_idx.cpu(), torch.arange(len(self.store.seqs))):
            raise NotImplementedError("kvq.hf: beam search (reordering the cache's rows) is not supported yet")

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("kvq.hf: cropping the cache (assisted or speculative decoding) is not supported "
                                  "yet")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("kvq.hf: repeating the cache's rows (num_return_sequences or beams expanded after "
                                  "the prompt) is not supported yet")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("kvq.hf: selecting rows of the cache is not supported yet")


def _per_layer(spec: str | Sequence[str], n_layers: int, what: str) -> list[str]:
    if isinstance(spec, str):
        return [spec] * n_layers
    specs = list(spec)
    if len(specs) != n_layers:
        raise ValueError(f"kvq.hf: {what} lists {len(specs)} codecs for a model of {n_layers} layers")
    return specs


class KvqCache(Cache):
    """A transformers cache whose keys and values are stored compressed by kvq codecs, with attention computed on
    the packed pages. Use it with a model loaded with `attn_implementation="kvq"`:

        model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvq")
        cache = kvq.hf.KvqCache(model.config, key_codec="int4", value_codec="int4")
        model.generate(**inputs, past_key_values=cache, max_new_tokens=64)

    key_codec, value_codec: codec specs (docs/METHODS.md), one for every layer or a list with one per layer.
    prefill: "exact" (the prompt attends to its own full-precision keys and values through SDPA, as with
    DynamicCache, then they are encoded) or "cache" (every position attends through the compressed cache, as
    decoding would: what `kvq ppl` measures). Later chunks of a prompt and every decode step always attend through
    the cache.
    max_tokens: positions per row the cache must hold (prompt plus new tokens; default: the model's
    max_position_embeddings, at most 8192); the pages for them are reserved at the first forward (address space on
    the CPU, device memory on CUDA). block_tokens (64 or 128), residual_tokens (newest tokens kept in fp32), seed,
    center_keys, sink_tokens: as kvq.KVCache. threads: the CPU attention's threads (0: one per core)."""

    def __init__(self, config, key_codec: str | Sequence[str] = "int4", value_codec: str | Sequence[str] = "int4", *,
                 prefill: str = "exact", max_tokens: int | None = None, block_tokens: int = 64,
                 residual_tokens: int = 0, seed: int = 0, center_keys: bool = False, sink_tokens: int = 0,
                 threads: int = 0):
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        n_layers = text.num_hidden_layers
        self.n_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        if prefill not in ("exact", "cache"):
            raise ValueError(f"kvq.hf: prefill='{prefill}' (need 'exact' or 'cache')")
        if max_tokens is None:
            max_tokens = min(getattr(text, "max_position_embeddings", 8192) or 8192, 8192)
        if max_tokens < 1:
            raise ValueError(f"kvq.hf: max_tokens = {max_tokens} (need >= 1)")
        self.options = Options(block_tokens, residual_tokens, seed, center_keys, sink_tokens, threads, prefill,
                               max_tokens)
        keys = _per_layer(key_codec, n_layers, "key_codec")
        values = _per_layer(value_codec, n_layers, "value_codec")
        for spec in set(keys) | set(values):
            if _kvq.Codec(spec, self.head_dim).needs_training:
                raise NotImplementedError(f"kvq.hf: codec '{spec}' needs training on the model's keys and values, "
                                          "which kvq.hf does not do yet; choose a codec without training")
        self._stores: dict[tuple, Store] = {}
        super().__init__(layers=[KvqLayer(self, i, keys[i], values[i]) for i in range(n_layers)])

    def _store(self, device: torch.device, key_codec: str, value_codec: str, batch: int) -> Store:
        key = (device, key_codec, value_codec)
        if key not in self._stores:
            n_layers = len(self.layers)
            sharing = sum(1 for l in self.layers if (l.key_codec, l.value_codec) == (key_codec, value_codec))
            pages = sharing * batch * math.ceil(self.options.max_tokens / self.options.block_tokens)
            self._stores[key] = Store(device, n_layers, self.n_kv_heads, self.head_dim, key_codec, value_codec,
                                      batch, pages, self.options)
        store = self._stores[key]
        if len(store.seqs) != batch:
            raise ValueError(f"kvq.hf: a batch of {batch} rows where the cache holds {len(store.seqs)}: reset() "
                             "the cache (or make a new one) for a new batch")
        return store

    def _drop_stores(self) -> None:
        for store in self._stores.values():
            store.remove()
        self._stores.clear()
        for layer in self.layers:
            layer._forget()

    def memory(self) -> dict:
        """The bytes the kvq caches hold, summed over devices and codec pairs (kvq.KVCache.memory()'s keys);
        `bits_per_element` is that of the pages in use, averaged over them."""
        total: dict = {}
        weighted_bits = 0.0
        for store in self._stores.values():
            memory = store.memory()
            weighted_bits += memory["bits_per_element"] * memory["pages_in_use"]
            for name, value in memory.items():
                if name != "bits_per_element":
                    total[name] = total.get(name, 0) + value
        pages = total.get("pages_in_use", 0)
        total["bits_per_element"] = weighted_bits / pages if pages else 0.0
        return total
