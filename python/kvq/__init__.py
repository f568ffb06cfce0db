"""kvq: KV-cache codecs for LLM inference, a paged compressed KV cache, and attention on the packed cache.

The API (docs/python.md has examples):

- ``Codec(spec, dim, seed=0, block_tokens=64, role="key")``: one codec; ``encode`` / ``decode`` token vectors
  to and from blocks of bytes, ``train``, ``state`` / ``load_state``.
- ``KVCache(n_layers, n_kv_heads, head_dim, *, capacity_pages, key_codec="f16", value_codec="f16", ...,
  device="cpu")``: the paged compressed cache; ``append`` tokens, ``decode_attention`` / ``prefill_attention`` on
  the packed pages, ``read`` them back decoded, ``memory``, ``save`` / ``KVCache.load``. On ``device="cuda:N"``
  (or a copy, ``to("cuda")``; ``to("cpu")`` back) its pages live on that CUDA device: ``append`` /
  ``append_batch`` from torch CUDA tensors and ``decode_attention`` on CUDA tensors by the fused CUDA kernels, on
  torch's current stream. ``cuda_available()`` says whether a device can be used here, ``cuda_unavailable_reason()``
  why not.
- ``distortion(codec, ...)`` and ``attention_error(key_codec, value_codec, ...)``: a codec's distortion on random
  unit vectors and a codec pair's error at the attention output, as dicts.
- ``load_calibration(path)``: a calibration file written by ``kvq calibrate``, as a read-only ``Calibration``
  (the model it was made for, its budget, and per layer a ``LayerCodecs``: codecs, key centering, trained states);
  ``kvq.hf.KvqCache(config, calib=path)`` builds a transformers cache from it.
- ``Error``: what every failed check of the library raises (a ``ValueError``); a wrong kind of array (dtype,
  device, not C-contiguous) raises ``TypeError``.

Arrays are float32, C-contiguous and in CPU memory (a CUDA cache's: on its device): NumPy arrays or anything with
``__dlpack__`` (torch tensors), read in place. Results are new NumPy arrays (a CUDA cache's: torch CUDA tensors), or
written into ``out=``.
"""

from ._kvq import (
    Calibration,
    Codec,
    Error,
    KVCache,
    LayerCodecs,
    __version__,
    attention_error,
    attention_isa,
    codec_names,
    cuda_available,
    cuda_unavailable_reason,
    distortion,
    load_calibration,
)

__all__ = [
    "Calibration",
    "Codec",
    "Error",
    "KVCache",
    "LayerCodecs",
    "__version__",
    "attention_error",
    "attention_isa",
    "codec_names",
    "cuda_available",
    "cuda_unavailable_reason",
    "distortion",
    "load_calibration",
]
