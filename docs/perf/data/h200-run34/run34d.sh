#!/usr/bin/env bash
# Run 34d: the tile copy from per-source origins (and runs 34b-c's turbo_mse and turbo_rvq encoders): every GPU
# test on the default pairs, append timing twice, the append and device-cache tests under memcheck, the append shapes under racecheck.
set -uo pipefail
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
cmake --preset cuda-device -Wno-dev -Wno-deprecated >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 2>&1 | grep -v "bytes differ" | tail -8
echo "tests at $(( $(date +%s) - start )) s"
for n in 1 2; do timeout 100 build/cuda-device/kvq bench append --device cuda --batch 32 --chunk 4096 --json > "$OUT/append$n.jsonl" || echo "append bench failed"; done
python3 - "$OUT/append1.jsonl" "$OUT/append2.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]).readlines() + open(sys.argv[2]).readlines():
    for row in json.loads(line)["rows"]:
        if row["mode"] == "prefill": print(f'{row["codec"]:14s} {row["us_per_call"]:10.1f} us  of copy {row["bw_fraction"]:.3f}')
PY
echo "timed at $(( $(date +%s) - start )) s"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.*:CudaDeviceCache.*-CudaDeviceCache.AppendsMatchTheHostCache' > "$OUT/memcheck.log" 2>&1 && echo "memcheck clean" || { echo "memcheck FAILED or timed out"; tail -8 "$OUT/memcheck.log"; }
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.SanitizerShapes*' > "$OUT/racecheck.log" 2>&1 && echo "racecheck clean" || { echo "racecheck FAILED or timed out"; tail -8 "$OUT/racecheck.log"; }
echo "sanitized at $(( $(date +%s) - start )) s"
tar czf "$OUT/logs.tar.gz" -C "$OUT" build.log memcheck.log racecheck.log  2>/dev/null && rm -f "$OUT"/{build,memcheck,racecheck}.log
echo "done in $(( $(date +%s) - start )) s"
