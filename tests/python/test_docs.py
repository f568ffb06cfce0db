"""The Python examples of docs/python.md (the device cache's where a CUDA device is) and the scripts of
examples/python run as they are."""

import pathlib
import re
import runpy
from importlib.util import find_spec

import kvq

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_docs_example_runs():
    text = (ROOT / "docs" / "python.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/python.md has a python example"
    for block in blocks:
        if block.startswith("# needs a CUDA device") and not (kvq.cuda_available() and find_spec("torch")):
            continue
        exec(compile(block, "docs/python.md", "exec"), {})


def test_examples_run(capsys):
    scripts = sorted((ROOT / "examples" / "python").glob("*.py"))
    assert scripts
    for script in scripts:
        runpy.run_path(str(script), run_name="__main__")
        assert "bits per element" in capsys.readouterr().out
