"""What a KvqCache takes from a calibration file (`kvq calibrate`, kvq.load_calibration): each layer's codecs, key
centering and trained codec states, the page size and sink tokens, after checking that the file fits the model.

The file identifies its model by shape, architecture and a CRC-32C of the GGUF's metadata; a transformers model has
no GGUF metadata, so the shape and the architecture are checked and a model of the same shape and architecture but
other weights (another fine-tune) cannot be told apart."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence, Union

from .. import _kvq

# A file's architecture (the GGUF's general.architecture, or llama2.c) -> the transformers model types it fits.
ARCHITECTURES = {
    "llama": ("llama",),
    "llama2.c": ("llama",),
    "qwen2": ("qwen2",),
    "gemma3": ("gemma3_text", "gemma3"),
}


@dataclass(frozen=True)
class LayerSetup:
    """How one layer's kvq cache is made: its codecs, key centering, and the states its codecs start from."""
    key_codec: str
    value_codec: str
    center_keys: bool = False
    key_state: bytes = b""
    value_state: bytes = b""

    @property
    def store_key(self) -> tuple[str, str, bool]:
        """Layers with the same key share a kvq cache (on one device): a cache has one pair and one centering for
        every layer, while each layer's codecs hold their own trained state."""
        return self.key_codec, self.value_codec, self.center_keys


def load(calib: Union[str, os.PathLike, "_kvq.Calibration"]) -> "_kvq.Calibration":
    return calib if isinstance(calib, _kvq.Calibration) else _kvq.load_calibration(calib)


def check_model(calib: "_kvq.Calibration", text_config) -> None:
    """ValueError naming the first difference between the file's model and `text_config` (transformers' decoder
    config): architecture, then layers, query heads, kv heads, head dimension."""
    model_type = getattr(text_config, "model_type", "")
    fits = ARCHITECTURES.get(calib.architecture)
    if fits is None:
        raise ValueError(f"kvq.hf: the calibration is for architecture '{calib.architecture}', which kvq.hf does "
                         f"not run (known: {', '.join(sorted(ARCHITECTURES))})")
    if model_type not in fits:
        raise ValueError(f"kvq.hf: the calibration is for another model: its architecture is "
                         f"'{calib.architecture}', the model's type '{model_type}'")
    heads = text_config.num_attention_heads
    shape = [("layer count", calib.n_layers, text_config.num_hidden_layers),
             ("query head count", calib.n_heads, heads),
             ("kv head count", calib.n_kv_heads, getattr(text_config, "num_key_value_heads", None) or heads),
             ("head dimension", calib.head_dim,
              getattr(text_config, "head_dim", None) or text_config.hidden_size // heads)]
    for what, file, model in shape:
        if file != model:
            raise ValueError(f"kvq.hf: the calibration is for another model: its {what} is {file}, the model's "
                             f"{model}")


def check_arguments(calib: "_kvq.Calibration", head_dim: int, *, key_codec, value_codec, block_tokens,
                    sink_tokens, center_keys, seed: int) -> None:
    """ValueError for a KvqCache argument given with `calib` that says otherwise than the file (None: not given)."""
    layers = calib.layers
    for role, given in (("key", key_codec), ("value", value_codec)):
        if given is None:
            continue
        specs = [given] * len(layers) if isinstance(given, str) else list(given)
        file = [getattr(l, f"{role}_codec") for l in layers]
        if _canonical(specs, head_dim, role) != _canonical(file, head_dim, role):
            raise ValueError(f"kvq.hf: {role}_codec={given!r} contradicts the calibration, whose layers' {role} "
                             f"codecs are {file}: leave {role}_codec out to use the file's")
    for name, given, file in (("block_tokens", block_tokens, calib.block_tokens),
                              ("sink_tokens", sink_tokens, calib.sink_tokens)):
        if given is not None and given != file:
            raise ValueError(f"kvq.hf: {name}={given} contradicts the calibration's {file}: leave {name} out to "
                             "use the file's")
    if center_keys is not None:
        for i, l in enumerate(layers):
            if l.center_keys != center_keys:
                stored = "centers layer {}'s keys" if l.center_keys else "stores layer {}'s keys plain"
                raise ValueError(f"kvq.hf: center_keys={center_keys} contradicts the calibration, which "
                                 f"{stored.format(i)}: leave center_keys out to use the file's")
    trained = any(l.key_state or l.value_state for l in layers)
    if trained and seed != 0:
        raise ValueError(f"kvq.hf: seed={seed} with a calibration holding trained codec states, which belong to "
                         "the codecs of seed 0 (a codebook lives in its codec's rotated space): leave seed at 0")


def layer_setups(calib: "_kvq.Calibration") -> list[LayerSetup]:
    return [LayerSetup(l.key_codec, l.value_codec, l.center_keys, l.key_state, l.value_state) for l in calib.layers]


def explicit_setups(key_codec: str | Sequence[str], value_codec: str | Sequence[str], center_keys: bool,
                    n_layers: int) -> list[LayerSetup]:
    """Layers from KvqCache's own arguments: one spec for every layer or a list of one per layer."""
    keys = _per_layer(key_codec, n_layers, "key_codec")
    values = _per_layer(value_codec, n_layers, "value_codec")
    return [LayerSetup(k, v, center_keys) for k, v in zip(keys, values)]


def _canonical(specs: list[str], head_dim: int, role: str) -> list[str]:
    return [_kvq.Codec(spec, head_dim, role=role).spec for spec in specs]


def _per_layer(spec: str | Sequence[str], n_layers: int, what: str) -> list[str]:
    if isinstance(spec, str):
        return [spec] * n_layers
    specs = list(spec)
    if len(specs) != n_layers:
        raise ValueError(f"kvq.hf: {what} lists {len(specs)} codecs for a model of {n_layers} layers")
    return specs
