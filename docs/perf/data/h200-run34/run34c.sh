#!/usr/bin/env bash
# Run 34c: turbo_rvq's append by warp-built stream words (and run 34b's turbo_mse): every GPU test on the default
# pairs, append timing, the append tests under memcheck and racecheck, and ncu source counters of the kivi:2, int4
# and turbo_mse:3 encoders (-lineinfo).
set -uo pipefail
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
cmake --preset cuda-device -Wno-dev -Wno-deprecated -DCMAKE_CUDA_FLAGS=-lineinfo >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 2>&1 | grep -v "bytes differ" | tail -8
echo "tests at $(( $(date +%s) - start )) s"
timeout 120 build/cuda-device/kvq bench append --device cuda --batch 32 --chunk 4096 --json > "$OUT/append.jsonl" || echo "append bench failed"
python3 - "$OUT/append.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    for row in json.loads(line)["rows"]:
        if row["mode"] == "prefill": print(f'{row["codec"]:14s} {row["us_per_call"]:10.1f} us  of copy {row["bw_fraction"]:.3f}')
PY
echo "timed at $(( $(date +%s) - start )) s"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.*:CudaDeviceCache.*-CudaDeviceCache.AppendsMatchTheHostCache' > "$OUT/memcheck.log" 2>&1 && echo "memcheck clean" || { echo "memcheck FAILED or timed out"; tail -8 "$OUT/memcheck.log"; }
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.SanitizerShapes*' > "$OUT/racecheck.log" 2>&1 && echo "racecheck clean" || { echo "racecheck FAILED or timed out"; tail -8 "$OUT/racecheck.log"; }
echo "sanitized at $(( $(date +%s) - start )) s"
for c in kivi:2 int4 turbo_mse:3; do
  n=${c%%:*}
  timeout 90 ncu --set full --import-source yes -k regex:encode_pages --launch-skip 1 --launch-count 1 -f -o "$OUT/enc-$n" \
    build/cuda-device/kvq bench append --device cuda --batch 32 --chunk 4096 --codec "$c" --reps 1 > "$OUT/ncu-$n.log" 2>&1 || echo "ncu $c failed"
  ncu -i "$OUT/enc-$n.ncu-rep" --page source --csv --print-source cuda,sass 2>/dev/null | gzip > "$OUT/src-$n.csv.gz"
  ncu -i "$OUT/enc-$n.ncu-rep" --page details 2>/dev/null | grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|Executed Ipc|Registers Per|Achieved Occupancy" | head -8
  rm -f "$OUT/enc-$n.ncu-rep"
done
tar czf "$OUT/logs.tar.gz" -C "$OUT" build.log memcheck.log racecheck.log ncu-kivi.log ncu-int4.log ncu-turbo_mse.log 2>/dev/null && rm -f "$OUT"/{build,memcheck,racecheck}.log "$OUT"/ncu-*.log
echo "done in $(( $(date +%s) - start )) s"
