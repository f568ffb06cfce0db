"""Key channel layouts: the order of a head's channels that RoPE rotates in pairs, and the permutation from
transformers' order to a calibration file's.

transformers rotates channels i and i + head_dim/2 together (rotate_half: "rope_halves") in every architecture
kvq.hf runs (Llama, Qwen2, Gemma 3). kvq's own runner keeps a GGUF's order: llama.cpp's converter interleaves a
Llama model's pairs as (2i, 2i+1) ("rope_adjacent_pairs"), so a calibration of a GGUF Llama model measured and
trained its key codecs on that order. Per-channel codecs (kivi), channel groups (int4, int8) and trained codebooks
(vecinfer) are not invariant to a permutation of the channels, so keys go to kvq in the file's order; queries are
permuted alike, which leaves every attention score as it is. Values are not rotated by RoPE and keep their order."""

from __future__ import annotations

TRANSFORMERS_LAYOUT = "rope_halves"
LAYOUTS = ("rope_adjacent_pairs", "rope_halves")


def key_order(layout: str, head_dim: int, partial_rotary_factor: float = 1.0) -> list[int] | None:
    """The channel indices that put transformers' keys and queries into `layout` (keys[..., order]); None where
    transformers' order is that layout already."""
    if layout not in LAYOUTS:
        raise ValueError(f"kvq.hf: the calibration's channel layout '{layout}' is unknown (known: "
                         f"{', '.join(LAYOUTS)})")
    if layout == TRANSFORMERS_LAYOUT:
        return None
    if partial_rotary_factor != 1.0:
        raise NotImplementedError(f"kvq.hf: a calibration in the '{layout}' channel layout for a model whose RoPE "
                                  f"rotates part of each head (partial_rotary_factor {partial_rotary_factor})")
    # GGUF's channel j is transformers' channel j // 2 of the first half (j even) or of the second (j odd).
    return [j // 2 + (j % 2) * (head_dim // 2) for j in range(head_dim)]
