"""bench/gpu/e2e.py's pure-Python parts on the CPU with a tiny Llama: the chunked prefill, the decode loop, the
rows it writes (--json, --resume), the synthetic fill of a kvq cache, and e2e_plot.py's table and PNG. The GPU
numbers come from bench/gpu/e2e.sh on the GPU machine (docs/perf/e2e.md)."""

import importlib.util
import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench", "gpu")


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


e2e = load("e2e")
e2e_plot = load("e2e_plot")

STEPS, WARMUP = 3, 1
TINY_RUN = ["--device", "cpu", "--tiny", "--chunk", "64", "--steps", str(STEPS), "--warmup", str(WARMUP)]


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory):
    """Two calls into one file: dynamic and kvq int4 at 2 x 100 (two prefill chunks), then with --resume the same
    cells again (skipped) and kvq int4 at 1 x 150 filled with synthetic tokens after its first chunk."""
    path = str(tmp_path_factory.mktemp("e2e") / "e2e.jsonl")
    assert e2e.main(TINY_RUN + ["--shapes", "2x100", "--caches", "dynamic", "kvq:int4/int4", "--json", path]) == 0
    assert e2e.main(TINY_RUN + ["--shapes", "2x100", "1x150", "--caches", "kvq:int4/int4", "--json", path,
                                "--resume", "--kvq-prefill", "synthetic"]) == 0
    return path


def test_rows(bench_json):
    written = rows(bench_json)
    metas = [r for r in written if r["kind"] == "meta"]
    cells = [r for r in written if r["kind"] == "cell"]
    assert len(metas) == 2
    assert metas[0]["weights_note"] == e2e.NOTE and metas[0]["torch"] and metas[0]["transformers"]
    assert metas[0]["steps"] == STEPS and metas[0]["model"] == "tiny Llama"
    assert [(r["cache"], r["batch"], r["ctx"]) for r in cells] == [
        ("dynamic", 2, 100), ("kvq:int4/int4", 2, 100), ("kvq:int4/int4", 1, 150)]  # --resume skipped 2 x 100
    for r in cells:
        assert r["status"] == "ok", r
        assert r["path"] == "eager"
        assert r["cache_tokens"] == r["ctx"] + WARMUP + STEPS
        assert r["ms_per_step_median"] > 0 and r["ms_per_step_mean"] > 0 and r["prefill_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 1e3 / r["ms_per_step_mean"])
        assert r["cache_bytes"] > 0 and r["bytes_per_token"] > 0
    dynamic, kvq_model, kvq_synthetic = cells
    assert dynamic["prefill"] == "model" and dynamic["prefill_tokens"] == 100
    assert kvq_model["prefill"] == "model" and kvq_model["bits_per_element"] == pytest.approx(4.5)
    assert kvq_synthetic["prefill"] == "first chunk + synthetic" and kvq_synthetic["prefill_tokens"] == 64
    assert kvq_synthetic["fill_s"] > 0
    capacity = {r["cache"]: r for r in written if r["kind"] == "capacity"}
    assert capacity["kvq:int4/int4"]["how"] == "computed"
    # int4 keys and values (4.5 + 4.5 bits) against fp32 ones (32 + 32): a sequence takes 9 / 64 of the bytes
    assert capacity["kvq:int4/int4"]["bytes_per_token"] == pytest.approx(dynamic["bytes_per_token"] * 9 / 64)
    assert capacity["kvq:int4/int4"]["max_batch"] > capacity["dynamic"]["max_batch"] > 0


def test_bytes_per_token_of_the_8b_shape():
    config = e2e.transformers.LlamaConfig(**e2e.LLAMA_8B)
    bf16 = e2e.torch.bfloat16
    assert e2e.bytes_per_token("dynamic", config, bf16)[0] == 2 * 32 * 8 * 128 * 2  # 128 KiB a token
    assert e2e.bytes_per_token("kvq:bf16/bf16", config, bf16)[0] == 2 * 32 * 8 * 128 * 2
    assert e2e.bytes_per_token("kvq:int4/int4", config, bf16)[0] == 2 * 32 * 8 * 128 * 4.5 / 8
    assert e2e.bytes_per_token("kvq:kivi:4/int4", config, bf16)[0] == 32 * 8 * 128 * (4.5 + 4.5) / 8


def test_unknown_cache_is_refused():
    with pytest.raises(SystemExit, match="unknown cache"):
        e2e.parse_args(["--caches", "kvq:int4"])


def test_plot_and_table(bench_json, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "e2e.png"
    assert e2e_plot.main([bench_json, "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "| `dynamic` |" in printed and "| `kvq:int4/int4` |" in printed and "2 x 100" in printed


def test_cache_names_and_kernel_kinds():
    assert e2e.kvq_codecs("kvq:int4/kivi:2+compile") == ("int4", "kivi:2")
    assert e2e.is_compiled("kvq:int4/int4+compile") and e2e.is_compiled("static-compile")
    assert not e2e.is_compiled("kvq:int4/int4") and not e2e.is_compiled("dynamic")
    e2e.check_cache_name("kvq:int4/int4+compile")
    with pytest.raises(SystemExit, match="compile"):
        e2e.check_cache_name("compiled")
    assert e2e.kernel_kind("void kvq::cuda::detail::decode_split_kernel<kvq::cuda::IntTraits<4> >(...)") == \
        "kvq attention"
    assert e2e.kernel_kind("void kvq::cuda::detail::encode_pages_kernel<...>(...)") == "kvq append"
    assert e2e.kernel_kind("nvjet_tst_128x64_64x8_1x1_v_bz_TNT") == "weights GEMMs"
    assert e2e.kernel_kind("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "fused (torch.compile)"
    assert e2e.kernel_kind("Memcpy DtoD (Device -> Device)") == "other kernels"


def test_negative_profile_steps_are_refused(capsys):
    with pytest.raises(SystemExit):
        e2e.parse_args(["--profile", "-1"])
    assert "--profile -1" in capsys.readouterr().err
