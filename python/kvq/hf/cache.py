"""KvqCache: a transformers `Cache` whose layers keep their keys and values in kvq's compressed pages.

Each model layer is a `KvqLayer`; its tokens live in one kvq cache (a `Store`) per (device, codec pair, key
centering), shared by the layers with those on that device, one kvq sequence per batch row; each layer's codecs
start from their own trained state where a calibration file gives one (calibration.py). The layer's `update` only
hands the new keys and values on: kvq's attention function (attention.py) appends them, leaving out padding, and
attends."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence, Union

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .. import _kvq
from . import attention, calibration, channels
from .calibration import LayerSetup
from .store import Store


@dataclass(frozen=True)
class Options:
    block_tokens: int
    residual_tokens: int
    seed: int
    sink_tokens: int
    threads: int
    prefill: str
    max_tokens: int
    key_order: tuple[int, ...] | None  # keys' and queries' channels in the calibration's layout (channels.py)


class KvqLayer(CacheLayerMixin):
    """One model layer's cache: the kvq layer `layer_idx` of its Store. `keys`/`values` stay None: the tokens are
    in the Store's pages, not in tensors."""

    is_compileable = False
    is_sliding = False

    def __init__(self, parent: "KvqCache", layer_idx: int, setup: LayerSetup):
        super().__init__()
        self.parent = parent
        self.layer_idx = layer_idx
        self.setup = setup
        self.store: Store | None = None
        self.seen = 0  # positions the model has passed through this layer, padding included
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.store = self.parent._store(key_states.device, self.setup, key_states.shape[0])
        self.store.start_layer(self.layer_idx, self.setup)
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


class KvqCache(Cache):
    """A transformers cache whose keys and values are stored compressed by kvq codecs, with attention computed on
    the packed pages. Use it with a model loaded with `attn_implementation="kvq"`:

        model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvq")
        cache = kvq.hf.KvqCache(model.config, key_codec="int4", value_codec="int4")
        model.generate(**inputs, past_key_values=cache, max_new_tokens=64)

    key_codec, value_codec: codec specs (docs/METHODS.md), one for every layer or a list with one per layer (default
    int4); codecs that need training only from a calibration file that holds their trained state.
    calib: a calibration file written by `kvq calibrate` for this model (a path, or a kvq.Calibration from
    kvq.load_calibration): every layer's key and value codec, key centering and trained codec states, and the
    file's block_tokens and sink_tokens. key_codec, value_codec, block_tokens, sink_tokens and center_keys are then
    left out (given, they must say what the file says: ValueError otherwise), and seed stays 0 where the file holds
    trained states. The file must be for a model of this config's architecture, layers, heads, kv heads and head
    dimension (ValueError naming the first difference); its checksum is of the GGUF's metadata, which a transformers
    model has not, so a model of the same shape and architecture with other weights cannot be detected. Where the
    file's key channel layout is not transformers' (a GGUF Llama model's interleaved RoPE pairs), keys and queries
    reach kvq permuted into the file's layout (channels.py): attention is the same, and the codecs see the channels
    they were chosen and trained on.
    prefill: "exact" (the prompt attends to its own full-precision keys and values through SDPA, as with
    DynamicCache, then they are encoded) or "cache" (every position attends through the compressed cache, as
    decoding would: what `kvq ppl` measures). Later chunks of a prompt and every decode step always attend through
    the cache.
    max_tokens: positions per row the cache must hold (prompt plus new tokens; default: the model's
    max_position_embeddings, at most 8192); the pages for them are reserved at the first forward (address space on
    the CPU, device memory on CUDA). block_tokens (64 or 128; default 64), residual_tokens (newest tokens kept in
    fp32), seed, center_keys (default False), sink_tokens (default 0): as kvq.KVCache. threads: the CPU attention's
    threads (0: one per core)."""

    def __init__(self, config, key_codec: str | Sequence[str] | None = None,
                 value_codec: str | Sequence[str] | None = None, *,
                 calib: Union[str, os.PathLike, "_kvq.Calibration", None] = None, prefill: str = "exact",
                 max_tokens: int | None = None, block_tokens: int | None = None, residual_tokens: int = 0,
                 seed: int = 0, center_keys: bool | None = None, sink_tokens: int | None = None, threads: int = 0):
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
        key_order = None
        if calib is None:
            setups = calibration.explicit_setups(key_codec or "int4", value_codec or "int4", bool(center_keys),
                                                 n_layers)
            block_tokens = 64 if block_tokens is None else block_tokens
            sink_tokens = 0 if sink_tokens is None else sink_tokens
        else:
            calib = calibration.load(calib)
            calibration.check_model(calib, text)
            calibration.check_arguments(calib, self.head_dim, key_codec=key_codec, value_codec=value_codec,
                                        block_tokens=block_tokens, sink_tokens=sink_tokens, center_keys=center_keys,
                                        seed=seed)
            setups = calibration.layer_setups(calib)
            block_tokens, sink_tokens = calib.block_tokens, calib.sink_tokens
            order = channels.key_order(calib.channel_layout, self.head_dim, _partial_rotary_factor(text))
            key_order = None if order is None else tuple(order)
        _check_trained(setups, self.head_dim)
        self.options = Options(block_tokens, residual_tokens, seed, sink_tokens, threads, prefill, max_tokens,
                               key_order)
        self._stores: dict[tuple, Store] = {}
        super().__init__(layers=[KvqLayer(self, i, setup) for i, setup in enumerate(setups)])

    def _store(self, device: torch.device, setup: LayerSetup, batch: int) -> Store:
        key = (device, *setup.store_key)
        if key not in self._stores:
            n_layers = len(self.layers)
            sharing = sum(1 for l in self.layers if l.setup.store_key == setup.store_key)
            pages = sharing * batch * math.ceil(self.options.max_tokens / self.options.block_tokens)
            self._stores[key] = Store(device, n_layers, self.n_kv_heads, self.head_dim, setup, batch, pages,
                                      self.options)
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


def _check_trained(setups: list[LayerSetup], head_dim: int) -> None:
    """NotImplementedError for a codec that needs training (vecinfer) without a trained state to start from."""
    needs_training: dict[tuple[str, str], bool] = {}
    for i, setup in enumerate(setups):
        for role, spec, state in (("key", setup.key_codec, setup.key_state),
                                  ("value", setup.value_codec, setup.value_state)):
            if (spec, role) not in needs_training:
                needs_training[spec, role] = _kvq.Codec(spec, head_dim, role=role).needs_training
            if needs_training[spec, role] and not state:
                raise NotImplementedError(f"kvq.hf: layer {i}'s {role} codec '{spec}' needs training on the "
                                          "model's keys and values, which kvq.hf does not do; choose a codec "
                                          "without training, or give a calibration file (calib=) that holds its "
                                          "trained state")


def _partial_rotary_factor(text_config) -> float:
    rope = getattr(text_config, "rope_parameters", None)
    factor = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    return float(factor or getattr(text_config, "partial_rotary_factor", None) or 1.0)
