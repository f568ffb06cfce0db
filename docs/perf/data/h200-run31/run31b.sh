#!/usr/bin/env bash
# Run 31b: the turbo encoders' lane-order norm and reciprocal, kivi:3's one-scaling decode, split counts at d = 256.
set -uo pipefail
start=$(date +%s)
cmake --preset cuda-device -Wno-dev -Wno-deprecated >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 2>&1 | tail -25
echo "tests at $(( $(date +%s) - start )) s"
K=build/cuda-device/kvq
timeout 240 $K bench append --device cuda --batch 32 --chunk 4096 --json > "$OUT/append.jsonl" || echo "append bench failed"
echo "appends at $(( $(date +%s) - start )) s"
timeout 120 $K bench attention --device cuda --dim 256 --q-heads 4 --kv-heads 1 --batch 32 --ctx 32768 --k kivi:3 --v kivi:3 --k kivi:3 --v kivi:2 --reps 30 --json > "$OUT/d256.jsonl"
timeout 120 $K bench attention --device cuda --batch 32 --ctx 131072 --k kivi:3 --v kivi:3 --k kivi:2 --v kivi:2 --k kivi:3 --v turbo_mse:2 --reps 30 --json > "$OUT/d128.jsonl"
for s in 0 4 8 16 32; do
  timeout 60 $K bench attention --device cuda --dim 256 --q-heads 4 --kv-heads 1 --batch 1 --ctx 4096 --k int8 --v int8 --k int4 --v int4 --k kivi:3 --v kivi:3 --splits $s --reps 50 --json
done > "$OUT/d256-splits.jsonl"
python3 - "$OUT" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/d*.jsonl")):
    for line in open(f):
        r = json.loads(line)
        for row in r["rows"]:
            print(f'{f.split("/")[-1]:17s} d{r["dim"]} {row["k"]:>7s}/{row["v"]:<11s} b{row["batch"]} ctx{row["ctx"]} {row["us_per_call"]:8.1f} us  of copy {row["bw_fraction"]:.2f}  vs bf16 {row["speedup_vs_baseline"]:.2f}x  splits {row["splits"]}')
for line in open(sys.argv[1] + "/append.jsonl"):
    r = json.loads(line)
    for row in r.get("rows", []):
        if row["mode"] == "prefill": print(f'append {row["codec"]:16s} {row["us_per_call"]:9.1f} us  of copy {row["bw_fraction"]:.3f}')
PY
echo "timed at $(( $(date +%s) - start )) s"
for tool in memcheck racecheck; do
  f='CudaAppend.SanitizerShapes*:DeviceRowNorm.*:DeviceUnitQuotient.*'
  [ $tool = memcheck ] && f="$f:CudaAppend.EveryRegistered*:CudaDecodeAttention.HeadDimensions*"
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter="$f" > "$OUT/$tool.log" 2>&1 && echo "$tool clean" || { echo "$tool FAILED or timed out"; tail -8 "$OUT/$tool.log"; }
done
echo "done in $(( $(date +%s) - start )) s"
