#!/usr/bin/env bash
# Registers, spills and static shared memory of every CUDA kernel (nvcc -Xptxas -v, sm_90), one line per kernel.
# Runs anywhere nvcc is (no GPU needed): bash bench/gpu/ptxas-report.sh > docs/perf/ptxas-h200.txt
# The codec pairs are those of the default build (src/cuda/decode_pairs.cmake), KVQ_CUDA_ALL_PAIRS=ON every pair;
# the translation units compile in parallel (KVQ_JOBS, default: every core).
set -euo pipefail
cd "$(dirname "$0")/../.."
export NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
export gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
cmake -DKVQ_PAIRS_DIR="$gen" -DKVQ_CUDA_ALL_PAIRS="${KVQ_CUDA_ALL_PAIRS:-OFF}" -P src/cuda/decode_pairs.cmake
report() {
  "$NVCC" -O3 -DNDEBUG --generate-code=arch=compute_90,code=sm_90 -std=c++20 -Iinclude -Isrc -I"$gen" -Xptxas -v \
    -c "$1" -o /dev/null 2>&1 | PYTHONPATH=bench/gpu python3 -c '
import re, sys
from pair_label import pair_label
name = None
for line in sys.stdin:
    m = re.search(r"Compiling entry function \x27(\w+)\x27", line) or re.search(r"Function properties for (\w+)", line)
    if m: name = m.group(1); continue
    m = re.search(r"Used (\d+) registers.*", line)
    if m and name:
        label = pair_label(name)
        label = f"split {label}" if label else re.search(r"([a-z][a-z_]*_kernel)", name).group(1)
        stats = re.sub(r"ptxas info\s*:\s*", "", line.strip())
        print(f"{label:40s} {stats}")
        name = None
' >"$gen/$(basename "$1").txt"
}
export -f report
ls "$gen"/cuda/decode_pair_*.cu src/cuda/decode_attention.cu | xargs -P "${KVQ_JOBS:-$(nproc)}" -I{} bash -c 'report {}'
for f in "$gen"/cuda/decode_pair_*.cu src/cuda/decode_attention.cu; do cat "$gen/$(basename "$f").txt"; done
