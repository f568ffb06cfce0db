"""kvq.hf on a real model: SmolLM2-135M-Instruct loaded by transformers from the GGUF that kvq's own runner reads
(scripts/fetch-models.sh; skipped where it is not fetched). Greedy generate() with f16 keys and values gives
DynamicCache's tokens, and the perplexity through transformers with an int4 kvq cache, or one from a calibration
file with trained codebooks, equals `kvq ppl`'s."""

import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvq.hf  # noqa: E402
from kvq.hf.store import Store  # noqa: E402
from hf_models import ROOT, smollm2  # noqa: E402

TEXT = os.path.join(ROOT, "..", "shared", "data", "text", "tinystories_val.txt")
CLI = os.environ.get("KVQ_CLI", os.path.join(ROOT, "build", "release", "kvq"))


@pytest.fixture(scope="module")
def model_and_tokenizer():
    model, tokenizer, path = smollm2()
    return model, tokenizer, path


def test_f16_generate_equals_dynamic_cache(model_and_tokenizer):
    model, tokenizer, _ = model_and_tokenizer
    ids = tokenizer("Once upon a time, there was a little robot who wanted to learn", return_tensors="pt").input_ids
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=64, do_sample=False,
                             past_key_values=transformers.DynamicCache(config=model.config))
        out = model.generate(ids, max_new_tokens=64, do_sample=False,
                             past_key_values=kvq.hf.KvqCache(model.config, key_codec="f16", value_codec="f16"))
    assert out.shape[1] == ids.shape[1] + 64
    assert torch.equal(out, ref), tokenizer.decode(out[0]) + "\n--- DynamicCache:\n" + tokenizer.decode(ref[0])


def transformers_ppl(model, tokens: list[int], window: int, chunk: int, *codecs, **cache_args) -> float:
    """kvq ppl's procedure through transformers: windows of `window` tokens from scratch, the first token of each
    context only (this tokenizer adds no BOS), `chunk` positions per forward, every position attending through the
    compressed cache as decoding would (prefill="cache"). codecs, cache_args: KvqCache's."""
    nll, scored = 0.0, 0
    for start in range(0, len(tokens), window):
        ids = torch.tensor([tokens[start:start + window]])
        cache = kvq.hf.KvqCache(model.config, *codecs, prefill="cache", max_tokens=window, **cache_args)
        logits = torch.cat([model(input_ids=ids[:, i:i + chunk], past_key_values=cache, use_cache=True).logits
                            for i in range(0, ids.shape[1], chunk)], dim=1)
        logp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
        nll -= float(logp.gather(1, ids[0, 1:, None]).sum())
        scored += ids.shape[1] - 1
    return float(torch.exp(torch.tensor(nll / scored)))


def gguf_channel_order(head_dim: int) -> torch.Tensor:
    """Where each channel of a GGUF llama model's rotary keys and queries sits in transformers' layout: GGUF keeps
    the rotary pairs interleaved (x0, x(d/2), x1, x(d/2+1), ...), transformers splits them in halves (its loader
    permutes the weights). Attention does not care, but a codec's channel groups and rotations do."""
    return torch.tensor([j // 2 + (j % 2) * (head_dim // 2) for j in range(head_dim)])


def in_gguf_channel_order(monkeypatch, head_dim: int) -> None:
    """Makes kvq.hf hand keys and queries to its caches in GGUF's channel order, as kvq's own runner has them."""
    order = gguf_channel_order(head_dim)
    append, append_attend = Store.append, Store.append_attend
    monkeypatch.setattr(Store, "append", lambda self, row, layer, k, v: append(self, row, layer, k[..., order], v))
    monkeypatch.setattr(Store, "append_attend", lambda self, row, layer, k, v, q, scale, window: append_attend(
        self, row, layer, k[..., order], v, q[..., order], scale, window))


def kvq_ppl(path: str, n_tokens: int, window: int, chunk: int, *cache_args: str) -> float:
    """`kvq ppl` over the first n_tokens of TEXT (skipped where the text or the program is missing). One thread: the
    same summation order on every run (int4's rounding turns float32 noise into ~0.05% of perplexity between thread
    counts); fp32 products as transformers computes them (kvq's default quantizes the products' activations to 8
    bits: +0.26% on SmolLM2)."""
    if not os.path.isfile(TEXT):
        pytest.skip("../shared/data/text/tinystories_val.txt is not here")
    if not os.access(CLI, os.X_OK):
        pytest.skip(f"the kvq program is not built ({CLI}; KVQ_CLI names another)")
    run = subprocess.run([CLI, "ppl", "--model", path, "--text", TEXT, "--max-tokens", str(n_tokens), "--ctx",
                          str(window), "--chunk", str(chunk), *cache_args, "--json", "--threads", "1",
                          "--f32-products"],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[0])["ppl"]


def text_tokens(tokenizer, n_tokens: int) -> list[int]:
    if tokenizer.bos_token_id is not None and tokenizer("a").input_ids[0] == tokenizer.bos_token_id:
        pytest.skip("this tokenizer adds BOS: transformers_ppl follows kvq ppl's procedure without it")
    with open(TEXT, encoding="utf-8") as f:
        text = f.read(20000)
    return tokenizer(text, add_special_tokens=False).input_ids[:n_tokens]


def test_int4_perplexity_equals_kvq_ppl(model_and_tokenizer, monkeypatch):
    # Measured agreement: 0.01-0.07%.
    model, tokenizer, path = model_and_tokenizer
    n_tokens, window, chunk = 512, 256, 64
    expected = kvq_ppl(path, n_tokens, window, chunk, "--k", "int4", "--v", "int4")
    tokens = text_tokens(tokenizer, n_tokens)
    in_gguf_channel_order(monkeypatch, model.config.head_dim)
    with torch.no_grad():
        ppl = transformers_ppl(model, tokens, window, chunk, "int4", "int4")
    assert abs(ppl / expected - 1) < 1e-3, (ppl, expected)


def test_calibrated_perplexity_equals_kvq_ppl(model_and_tokenizer):
    # A calibration of SmolLM2's GGUF (docs/quality.md): per-layer codecs, vecinfer codebooks trained on the GGUF's
    # key layout (adjacent RoPE pairs), which KvqCache(calib=) hands kvq by itself, and one sink token. Measured:
    # +0.06% of kvq ppl's perplexity; +2.2% with the keys left in transformers' layout.
    model, tokenizer, path = model_and_tokenizer
    calib = os.path.join(ROOT, "docs", "quality-data", "calib", "s-vq1024-bc512-3.calib")
    n_tokens, window, chunk = 512, 256, 64
    expected = kvq_ppl(path, n_tokens, window, chunk, "--calib", calib)
    tokens = text_tokens(tokenizer, n_tokens)
    with torch.no_grad():
        ppl = transformers_ppl(model, tokens, window, chunk, calib=calib)
    assert abs(ppl / expected - 1) < 1e-3, (ppl, expected)
