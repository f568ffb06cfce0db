#!/usr/bin/env bash
# Run 31a: the d = 256 block shapes (2-warp blocks of 2 stages): decode tests, Gemma's shape timed, racecheck.
set -uo pipefail
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
cmake --preset cuda-device -Wno-dev -Wno-deprecated >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaDecodeAttention.*:CudaFastDecode.*:CudaSlidingWindow.*:CudaSinkTokens.*-CudaDeviceCache.*' 2>&1 | tail -15
echo "tests at $(( $(date +%s) - start )) s"
P="--k kivi:3 --v kivi:3 --k kivi:4 --v kivi:2 --k kivi:4 --v kivi:4 --k int8 --v int8 --k int4 --v int4 --k kivi:3 --v int4 --k kivi:3 --v kivi:2"
timeout 120 build/cuda-device/kvq bench attention --device cuda --dim 256 --q-heads 4 --kv-heads 1 --batch 32 --ctx 32768 $P --reps 30 --json > "$OUT/d256.jsonl"
timeout 60 build/cuda-device/kvq bench attention --device cuda --dim 256 --q-heads 4 --kv-heads 1 --batch 1 --ctx 4096 $P --reps 30 --json > "$OUT/d256-small.jsonl"
timeout 60 build/cuda-device/kvq bench attention --device cuda --dim 256 --q-heads 8 --kv-heads 4 --batch 8 --ctx 32768 --k int8 --v int8 --k kivi:3 --v kivi:3 --reps 30 --json > "$OUT/d256-gqa2.jsonl"
python3 - "$OUT" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/d256*.jsonl")):
    for line in open(f):
        r = json.loads(line)
        for row in r["rows"]:
            print(f'{f.split("/")[-1]:18s} {row["k"]:>7s}/{row["v"]:<7s} b{row["batch"]} ctx{row["ctx"]} {row["us_per_call"]:8.1f} us  of copy {row["bw_fraction"]:.2f}  vs bf16 {row["speedup_vs_baseline"]:.2f}x  splits {row["splits"]} {row["kernel"]}')
PY
echo "timed at $(( $(date +%s) - start )) s"
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaDecodeAttention.HeadDimensions*' > "$OUT/racecheck.log" 2>&1 && echo "racecheck clean" || { echo "racecheck FAILED or timed out"; tail -8 "$OUT/racecheck.log"; }
echo "done in $(( $(date +%s) - start )) s"
