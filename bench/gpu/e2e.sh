#!/usr/bin/env bash
# Issue 14's end-to-end decode benchmark on the GPU machine (bench/gpu/e2e.py), in pieces that fit its 10-minute
# commands: installs the QuantizedCache backends offline from the wheels bench/gpu/pack-deps.sh gathered
# (.gpu-deps/wheels: optimum-quanto, hqq, termcolor), builds the Python package with the CUDA backend and only the
# decode pairs the benchmark's kvq caches use, then runs e2e.py with --resume into $OUT/e2e.jsonl, seeded with the
# rows of earlier calls (E2E_FROM, default docs/perf/data/e2e/e2e.jsonl), and starts no cell after KVQ_E2E_SECONDS
# (default 420) of the whole call. The same call again goes on where the last one stopped, once its e2e.jsonl is
# copied to E2E_FROM. Arguments go to e2e.py (e.g. --caches dynamic kvq:int4/int4 --shapes 8x32768).
#   here:     bash bench/gpu/pack-deps.sh
#   device:   run(command="bash bench/gpu/e2e.sh", carry=[".gpu-deps"]); then here:
#             cp /work/.device/.../e2e.jsonl docs/perf/data/e2e/e2e.jsonl (files_at of the reply)
# KVQ_E2E_PAIRS: the decode pairs to build (src/cuda/decode_pairs.cmake names; "default": the default build's).
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
json=$(realpath "$OUT")/e2e.jsonl
exec > >(tee "$OUT/e2e.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --find-links .gpu-deps/wheels optimum-quanto hqq \
  termcolor || echo "kvq-e2e: the QuantizedCache backends did not install (bench/gpu/pack-deps.sh gathers them)"
pairs=${KVQ_E2E_PAIRS:-"Bf16/Bf16;Int8/Int8;Int4/Int4;TurboMse3/TurboMse3;Kivi2/Kivi2;Kivi4/Int4"}
[ "$pairs" = default ] && pairs=""
# The system compiler, as in python-tests.sh: the image's CXX links libstdc++ statically, which crashes beside
# torch's shared one.
CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  python3 -m pip install -q --no-build-isolation --no-deps -Cbuild-dir=build/python-e2e -Ccmake.define.KVQ_CUDA=ON \
  "-Ccmake.define.KVQ_CUDA_PAIRS=$pairs" . || { echo "kvq-e2e: pip install failed"; exit 1; }
echo "kvq-e2e: packages installed in $(( $(date +%s) - start )) s"
from=${E2E_FROM:-docs/perf/data/e2e/e2e.jsonl}
[ -f "$from" ] && [ ! -f "$json" ] && cp "$from" "$json"
left=$(( ${KVQ_E2E_SECONDS:-420} - ($(date +%s) - start) ))
PYTHONUNBUFFERED=1 python3 bench/gpu/e2e.py --json "$json" --resume --max-seconds "$left" "$@"
python3 bench/gpu/e2e_plot.py "$json" --png "${json%.jsonl}.png" || echo "kvq-e2e: no plot"
echo "kvq-e2e: done in $(( $(date +%s) - start )) s"
