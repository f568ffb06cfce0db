#!/usr/bin/env python3
"""Independent reference for the Gemma 3 tests (tests/gemma3_test.cpp).

Reads the GGUF file with the `gguf` package, rebuilds the Hugging Face tokenizer from its metadata with the
`tokenizers` package (BPE with byte fallback, merges derived from the SentencePiece scores as Hugging Face's
converter does, spaces normalized to U+2581, control and user-defined tokens as added tokens matched in the raw
text), and runs a plain NumPy forward pass written the Hugging Face way: Gemma3RMSNorm's (1 + w) with w = the GGUF
weight - 1 (llama.cpp's converter stores 1 + w), RoPE with rotate_half, local layers (all but every sixth) with base
10000 and a sliding window, global layers with the file's base, q/k norms, post-attention and post-feed-forward norms,
tanh-GELU gate, embeddings times sqrt(hidden_size), queries scaled by query_pre_attn_scalar^-1/2 = head_dim^-1/2.

Prints JSON: the token ids of the test strings, and for the first positions of a fixed text the logits at chosen
token ids, the argmax and the logit range. Needs: pip install gguf numpy tokenizers.
Usage: tests/reference/gemma3_reference.py [path/to/gemma-3-270m-q4_k_m.gguf]
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

DEFAULT_PATH = ".cache/models/gemma3/gemma-3-270m-q4_k_m.gguf"
TEXT = "Once upon a time, there was a little robot who loved numbers like 42 and 1337."
POSITIONS = 8
TOKENIZER_STRINGS = [
    "Hello world",
    "  leading spaces and trailing   ",
    "Numbers: 3.14159, 2024-06-01 and 1,000,000!",
    "It's we're they've I'm you'll he'd",
    "Punctuation... (brackets) [x] {y} <z> \"quotes\" 'single' @#$%^&*",
    "Tabs\tand\nnewlines\n\nand\r\nCRLF\t\t\tthree tabs",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "Emoji 🙂🚀 and flags 🇫🇷 and a family 👨‍👩‍👧",
    "Arabic digits ٣٤٥ and fullwidth １２３",
    "<start_of_turn>user\nHi there<end_of_turn>\n<b>bold</b>",
    "Rare bytes: \x01\x7f and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ",
]
SLIDING_PERIOD = 6
SLIDING_BASE = 10000.0


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_numbers(reader, key):
    f = reader.fields[key]
    return [f.parts[i][0] for i in f.data]


def field_scalar(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def build_tokenizer(reader):
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    types = [int(t) for t in field_numbers(reader, "tokenizer.ggml.token_type")]
    vocab = {t: i for i, t in enumerate(tokens)}
    # Hugging Face's SentencePieceExtractor: every split of a normal piece into two pieces of the vocabulary is a
    # merge, ranked by the merged piece's score (the vocabulary is sorted by score).
    merges = []
    for piece, kind in zip(tokens, types):
        if kind != 1:
            continue
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += sorted(splits, key=lambda s: (vocab[s[0]], vocab[s[1]]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == 4])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types) if k == 3])
    return tok


def weights(reader):
    return {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors
            if t.name != "token_embd.weight"}


def gemma_rms_norm(x, gguf_weight, eps):
    w = gguf_weight - 1.0  # Hugging Face's parameter
    x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * (1.0 + w)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(reader, W, emb, ids):
    arch = "gemma3"
    n_layers = int(field_scalar(reader, f"{arch}.block_count"))
    n_head = int(field_scalar(reader, f"{arch}.attention.head_count"))
    n_kv = int(field_scalar(reader, f"{arch}.attention.head_count_kv"))
    hd = int(field_scalar(reader, f"{arch}.attention.key_length"))
    theta = float(field_scalar(reader, f"{arch}.rope.freq_base"))
    window = int(field_scalar(reader, f"{arch}.attention.sliding_window"))
    eps = float(field_scalar(reader, f"{arch}.attention.layer_norm_rms_epsilon"))
    dim = emb.shape[1]
    T = len(ids)
    pos = np.arange(T)

    def rope_tables(base):
        inv_freq = base ** (-np.arange(0, hd, 2) / hd)
        angles = np.outer(pos, inv_freq)
        return np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))

    causal = pos[None, :] <= pos[:, None]
    x = emb[ids].astype(np.float64) * np.sqrt(dim)
    for l in range(n_layers):
        p = f"blk.{l}."
        local = l % SLIDING_PERIOD != SLIDING_PERIOD - 1
        cos, sin = rope_tables(SLIDING_BASE if local else theta)
        mask = causal & (pos[:, None] - pos[None, :] < window) if local else causal
        h = gemma_rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = (h @ W[p + "attn_q.weight"].T).reshape(T, n_head, hd).transpose(1, 0, 2)
        k = (h @ W[p + "attn_k.weight"].T).reshape(T, n_kv, hd).transpose(1, 0, 2)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, n_kv, hd).transpose(1, 0, 2)
        q = gemma_rms_norm(q, W[p + "attn_q_norm.weight"], eps)
        k = gemma_rms_norm(k, W[p + "attn_k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, n_head // n_kv, axis=0)
        v = np.repeat(v, n_head // n_kv, axis=0)
        s = np.where(mask, q @ k.transpose(0, 2, 1) * hd ** -0.5, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(T, n_head * hd) @ W[p + "attn_output.weight"].T
        x = x + gemma_rms_norm(o, W[p + "post_attention_norm.weight"], eps)
        h = gemma_rms_norm(x, W[p + "ffn_norm.weight"], eps)
        f = gelu_tanh(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)
        x = x + gemma_rms_norm(f @ W[p + "ffn_down.weight"].T, W[p + "post_ffw_norm.weight"], eps)
    x = gemma_rms_norm(x, W["output_norm.weight"], eps)
    out = W["output.weight"] if "output.weight" in W else emb
    return np.stack([out @ row for row in x])  # tied classifier: the unscaled embedding


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_PATH
    reader = GGUFReader(path)
    tok = build_tokenizer(reader)
    result = {"tokenizer": [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids}
                            for s in TOKENIZER_STRINGS]}
    for case in result["tokenizer"]:
        decoded = tok.decode(case["ids"], skip_special_tokens=False)
        assert decoded == case["text"], (decoded, case["text"])

    bos = int(field_scalar(reader, "tokenizer.ggml.bos_token_id"))
    ids = ([bos] + tok.encode(TEXT, add_special_tokens=False).ids)[:POSITIONS]
    emb_tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    emb = dequantize(emb_tensor.data, emb_tensor.tensor_type).astype(np.float32)
    logits = forward(reader, weights(reader), emb, ids)
    probe = sorted(set(ids) | {0, 1, 3, 107, 1000, 10000, 100000, 262143})
    result["text"] = TEXT
    result["ids"] = ids
    result["probe_ids"] = probe
    result["positions"] = [
        {"argmax": int(row.argmax()), "max": float(row.max()), "min": float(row.min()),
         "probe": [round(float(row[i]), 4) for i in probe]}
        for row in logits
    ]
    json.dump(result, sys.stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main()
