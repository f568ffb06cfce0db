"""scripts/quality_rows.py and scripts/quality_plot.py on made-up `kvq ppl --json` rows: the merge over pieces
weighted by scored tokens, the Pareto front, the printed table and the PNG."""

import importlib.util
import json
import math
import os
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")
sys.path.insert(0, SCRIPTS)
import quality_rows  # noqa: E402

spec = importlib.util.spec_from_file_location("quality_plot", os.path.join(SCRIPTS, "quality_plot.py"))
quality_plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(quality_plot)


def row(k, v, bits_k, bits_v, skip, tokens, nll, kld, calib=""):
    r = {"k": k, "v": v, "ctx": 512, "skip_tokens": skip, "tokens": tokens, "mean_nll": nll, "ppl": math.exp(nll),
         "ppl_f16": math.exp(2.0), "kld": kld, "top1_agree": 0.9, "bits_per_element_k": bits_k,
         "bits_per_element_v": bits_v, "cache_bytes": 100, "cache_bytes_f16": 400}
    if calib:
        r["calib"] = calib
    return r


@pytest.fixture
def pieces(tmp_path):
    """Two pieces: int4 (better and fewer bits than int8 / int4: off the front), turbo_mse:2, a calibrated cache."""
    paths = []
    for skip, tokens in ((0, 100), (2048, 300)):
        rows = [row("int4", "int4", 4.5, 4.5, skip, tokens, 2.01 if skip == 0 else 2.03, 0.01 if skip else 0.03),
                row("int8", "int4", 8.5, 4.5, skip, tokens, 2.05, 0.02),
                row("turbo_mse:2", "turbo_mse:2", 2.25, 2.25, skip, tokens, 2.2, 0.2),
                row("int4", "int4", 3.5, 2.5, skip, tokens, 2.04, 0.05, calib="/x/smollm2-3.calib"),
                {"k": "f16", "v": "f16", "tokens": tokens, "skip_tokens": skip, "mean_nll": 2.0}]
        path = tmp_path / f"skip{skip}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(path))
    return paths


def test_merge_weighs_pieces_by_their_tokens(pieces):
    caches = {c["label"]: c for c in quality_rows.merge(pieces)}
    assert set(caches) == {"int4 / int4", "int8 / int4", "turbo_mse:2 / turbo_mse:2", "calibrated (smollm2-3.calib)"}
    int4 = caches["int4 / int4"]
    assert int4["tokens"] == 400 and int4["pieces"] == 2 and int4["bits"] == 4.5
    assert int4["kld"] == pytest.approx((100 * 0.03 + 300 * 0.01) / 400)
    assert int4["ppl"] == pytest.approx(math.exp((100 * 2.01 + 300 * 2.03) / 400))
    assert int4["dppl_pct"] == pytest.approx(100 * (int4["ppl"] / math.exp(2.0) - 1))


def test_a_piece_given_twice_is_an_error(pieces):
    with pytest.raises(ValueError, match="given twice"):
        quality_rows.merge([pieces[0], pieces[0]])


def test_pareto_front_keeps_the_caches_nothing_beats(pieces):
    front = quality_plot.pareto_front(quality_rows.merge(pieces), "kld")
    assert [c["label"] for c in front] == ["turbo_mse:2 / turbo_mse:2", "calibrated (smollm2-3.calib)",
                                           "int4 / int4"]


def test_table_and_png(pieces, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "quality.png"
    assert quality_plot.main(["--series", "tiny", *pieces, "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "| int4 / int4 | 4.50 / 4.50 (4.50) |" in printed and "int8 / int4" not in printed
    assert quality_plot.main(["--series", "empty", str(tmp_path / "missing.jsonl")]) == 1
