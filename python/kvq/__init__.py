"""kvq: KV-cache codecs for LLM inference, a paged compressed KV cache, and attention on the packed cache.

The API (docs/python.md has examples):

- ``Codec(spec, dim, seed=0, block_tokens=64, role="key")``: one codec; ``encode`` / ``decode`` token vectors
  to and from blocks of bytes, ``train``, ``state`` / ``load_state``.
- ``KVCache(n_layers, n_kv_heads, head_dim, *, capacity_pages, key_codec="f16", value_codec="f16", ...)``: the
  paged compressed cache on the CPU; ``append`` tokens, ``decode_attention`` / ``prefill_attention`` on the
  packed pages, ``read`` them back decoded, ``memory``, ``save`` / ``KVCache.load``.
- ``distortion(codec, ...)`` and ``attention_error(key_codec, value_codec, ...)``: a codec's distortion on random
  unit vectors and a codec pair's error at the attention output, as dicts.
- ``Error``: what every failed check of the library raises (a ``ValueError``); a wrong kind of array (dtype,
  device, not C-contiguous) raises ``TypeError``.

Arrays are float32, C-contiguous and in CPU memory: NumPy arrays or anything with ``__dlpack__`` (torch tensors),
read in place. Results are new NumPy arrays, or written into ``out=``.
"""

from ._kvq import (
    Codec,
    Error,
    KVCache,
    __version__,
    attention_error,
    attention_isa,
    codec_names,
    distortion,
)

__all__ = [
    "Codec",
    "Error",
    "KVCache",
    "__version__",
    "attention_error",
    "attention_isa",
    "codec_names",
    "distortion",
]
