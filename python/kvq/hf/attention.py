"""kvq's attention function for transformers, registered as attn_implementation="kvq" (with the SDPA mask
function under the same name, so that padding masks reach it).

transformers calls a layer's cache `update` and then the attention function, which is not handed the cache. The
KvqLayer's update hands itself over here (one slot per thread); the attention call that follows for the same layer
and the same key tensor takes it and does the work: appends the new tokens to the kvq cache (padding left out) and
attends through the compressed pages. A call without a KvqLayer waiting (no cache, use_cache=False, or another cache
type, which passes all keys and values) runs SDPA over what it is given, which is exact."""

from __future__ import annotations

import threading

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "kvq"
_waiting = threading.local()


def hand_over(layer) -> None:
    """Called by KvqLayer.update: `layer` holds the keys and values the next attention call will be given."""
    _waiting.layer = layer


def _take(module, key: torch.Tensor):
    layer = getattr(_waiting, "layer", None)
    if layer is None or layer.pending is None or layer.pending[0] is not key:
        return None
    if getattr(module, "layer_idx", layer.layer_idx) != layer.layer_idx:
        return None
    _waiting.layer = None
    return layer


def _own_columns(attention_mask: torch.Tensor | None, batch: int, n: int) -> torch.Tensor | None:
    """Which of the chunk's n tokens are real (not padding), [batch, n] bool, from the 4D mask: a token is kept when
    its own query row may attend to its own column (padding masks both). None: no mask, every token is real."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, 0, -n:, -n:]
    own = torch.diagonal(mask, dim1=-2, dim2=-1)
    if own.dtype != torch.bool:
        own = own > torch.finfo(own.dtype).min / 2  # additive masks: 0 to attend, the dtype's minimum not to
    return own.expand(batch, n)


@torch.compiler.disable  # kvq's kernels and the cache's bookkeeping run as they are under torch.compile
def kvq_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                  sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    if softcap is not None:
        raise NotImplementedError("kvq attention: attention logit soft-capping (Gemma 2) is not supported")
    layer = _take(module, key)
    if layer is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if dropout:
        raise NotImplementedError("kvq attention: attention dropout (training) is not supported")
    keys, values = layer.pending
    layer.pending = None
    batch, n_q_heads, n, head_dim = query.shape
    scale = float(scaling) if scaling is not None else head_dim ** -0.5
    window = int(sliding_window or 0)
    store, index = layer.store, layer.layer_idx
    own = _own_columns(attention_mask, batch, n)
    first_chunk = layer.seen == n  # update() has counted this chunk: nothing came before it

    if first_chunk and layer.parent.options.prefill == "exact":
        out, _ = sdpa_attention_forward(module, query, keys, values, attention_mask, scaling=scale,
                                        sliding_window=sliding_window, **kwargs)
        for row in range(batch):
            kept = slice(None) if own is None else own[row]
            store.append(row, index, keys[row][:, kept], values[row][:, kept])
        return out, None

    # A step captured as a CUDA graph (graph.py) has no padding and may not wait for the device.
    if n == 1 and (store.graph_step is not None or own is None or bool(own.all())):
        out = store.decode_step(index, keys, values, query, scale, window)
        return out.to(query.dtype).unsqueeze(1), None

    out = torch.zeros(batch, n, n_q_heads, head_dim, dtype=torch.float32, device=query.device)
    for row in range(batch):
        kept = slice(None) if own is None else own[row]
        out[row, kept] = store.append_attend(row, index, keys[row][:, kept], values[row][:, kept],
                                             query[row][:, kept], scale, window)
    return out.to(query.dtype), None


def register() -> None:
    """Registers kvq's attention and mask functions with transformers under the name "kvq" (done on import)."""
    AttentionInterface.register(NAME, kvq_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
