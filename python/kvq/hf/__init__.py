"""kvq in Hugging Face transformers: a compressed KV cache for `generate()` and the attention that reads it.

    import kvq.hf
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kvq")
    cache = kvq.hf.KvqCache(model.config, key_codec="int4", value_codec="int4")
    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=64)

On CUDA, DecodeGraph replays a whole decode step as a CUDA graph, and kvq.hf.generate(model, ...) is
model.generate() with its decode steps replayed that way (graph.py).

Importing this module registers the attention function (and its mask function) under the name "kvq".
docs/python.md says what is supported.
"""

from . import attention
from .cache import KvqCache, KvqLayer
from .graph import DecodeGraph, generate

attention.register()

__all__ = ["DecodeGraph", "KvqCache", "KvqLayer", "generate"]
