#!/usr/bin/env bash
# Run 31c: the int8/int4 and kivi encoders' quotients without divisions (with the turbo norm and quotient of 31b).
set -uo pipefail
start=$(date +%s)
cmake --preset cuda-device -Wno-dev -Wno-deprecated >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 2>&1 | tail -25
echo "tests at $(( $(date +%s) - start )) s"
K=build/cuda-device/kvq
timeout 240 $K bench append --device cuda --batch 32 --chunk 4096 --json > "$OUT/append.jsonl" || echo "append bench failed"
python3 - "$OUT" <<'PY'
import json, sys
for line in open(sys.argv[1] + "/append.jsonl"):
    for row in json.loads(line).get("rows", []):
        if row["mode"] == "prefill": print(f'append {row["codec"]:16s} {row["us_per_call"]:9.1f} us  of copy {row["bw_fraction"]:.3f}')
PY
echo "appends at $(( $(date +%s) - start )) s"
for tool in memcheck racecheck; do
  f='CudaAppend.SanitizerShapes*:DeviceRowNorm.*:DeviceUnitQuotient.*'
  [ $tool = memcheck ] && f="$f:CudaAppend.EveryRegistered*:CudaAppend.KiviZeros*"
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter="$f" > "$OUT/$tool.log" 2>&1 && echo "$tool clean" || { echo "$tool FAILED or timed out"; tail -8 "$OUT/$tool.log"; }
done
if command -v ncu >/dev/null; then
  for c in int4 kivi:4 turbo_mse:3; do
    timeout 60 ncu --clock-control none -k regex:encode --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats $K bench append --device cuda --batch 32 --chunk 4096 --codec $c --reps 3 > "$OUT/ncu-enc-${c%%:*}.txt" 2>&1 || echo "ncu $c failed"
    grep -E "Duration|Issue Slots Busy|Executed Ipc A|Registers Per|Achieved Occupancy" "$OUT/ncu-enc-${c%%:*}.txt" | head -6
  done
fi
echo "done in $(( $(date +%s) - start )) s"
