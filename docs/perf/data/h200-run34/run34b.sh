#!/usr/bin/env bash
# Run 34b: the turbo_mse append encoder by groups (binary search, words by warp reduction or per thread): append tests, sanitizers, timing.
set -uo pipefail
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
cmake --preset cuda-device -Wno-dev -Wno-deprecated -DKVQ_CUDA_PAIRS="Int4/Int4;F16/F16;Int8/Int8" >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.*:DeviceRowNorm.*:DeviceUnitQuotient.*:CudaFragments.*' 2>&1 | tail -15
echo "tests at $(( $(date +%s) - start )) s"
timeout 240 build/cuda-device/kvq bench append --device cuda --batch 32 --chunk 4096 --json > "$OUT/append.jsonl" || echo "append bench failed"
python3 - "$OUT/append.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    for row in r.get("rows", [r]):
        print({k: row[k] for k in row if k in ("codec", "mode", "tokens", "us_per_call", "bw_fraction", "gbps", "kernel")})
PY
echo "timed at $(( $(date +%s) - start )) s"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.*:DeviceRowNorm.*:DeviceUnitQuotient.*' > "$OUT/memcheck.log" 2>&1 && echo "memcheck clean" || { echo "memcheck FAILED or timed out"; tail -8 "$OUT/memcheck.log"; }
echo "done in $(( $(date +%s) - start )) s"
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.SanitizerShapes*' > "$OUT/racecheck.log" 2>&1 && echo "racecheck clean" || { echo "racecheck FAILED or timed out"; tail -8 "$OUT/racecheck.log"; }
echo "done in $(( $(date +%s) - start )) s"
