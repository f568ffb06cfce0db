#!/usr/bin/env bash
# The whole GPU job in one device call: build for sm_90, run the GPU tests, time PyTorch SDPA (bf16, GQA) and
# every kvq CUDA kernel over batch {1, 8, 32} x ctx {4096, 32768, 131072} with the device's copy bandwidth, run
# the GPU tests under compute-sanitizer memcheck and racecheck, and print the table last. Everything it prints is
# also written under $OUT (run.log, kvq.jsonl, sdpa.jsonl, summary.json, ptxas.log, sanitizer logs).
#   here:     bash bench/gpu/pack-deps.sh
#   device:   run(command="bash bench/gpu/run.sh", carry=[".gpu-deps"])
# KVQ_GPU_QUICK=1 times one shape only; KVQ_SANITIZE_FILTER picks the sanitized tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader || true
start=$(date +%s)
cmake --preset cuda-device -Wno-dev -Wno-deprecated >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" || { tail -50 "$OUT/build.log"; exit 1; }
echo "kvq-gpu: built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 2>&1 | tail -40
echo "kvq-gpu: tests done at $(( $(date +%s) - start )) s"

: >"$OUT/kvq.jsonl"
pairs=(--k int4 --v int4 --k int8 --v int8 --k f16 --v f16)
batches=(1 8 32) ctxs=(4096 32768 131072)
[ "${KVQ_GPU_QUICK:-0}" = 1 ] && batches=(8) ctxs=(32768)
for b in "${batches[@]}"; do
  for c in "${ctxs[@]}"; do
    timeout 60 build/cuda-device/kvq bench attention --device cuda --batch "$b" --ctx "$c" "${pairs[@]}" --reps 30 \
      --json >>"$OUT/kvq.jsonl" || echo "kvq-gpu: kvq bench batch $b ctx $c failed"
  done
done
echo "kvq-gpu: kvq timing done at $(( $(date +%s) - start )) s"
PYTHONUNBUFFERED=1 timeout 180 python3 bench/gpu/sdpa_bench.py --batch "${batches[@]}" --ctx "${ctxs[@]}" \
  >"$OUT/sdpa.jsonl" || echo "kvq-gpu: SDPA timing failed"
echo "kvq-gpu: SDPA timing done at $(( $(date +%s) - start )) s"

if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests \
      --gtest_brief=1 --gtest_filter="${KVQ_SANITIZE_FILTER:-*}" >"$OUT/sanitizer-$tool.log" 2>&1 &&
      echo "kvq-gpu: compute-sanitizer $tool: clean" ||
      { echo "kvq-gpu: compute-sanitizer $tool FAILED or timed out"; tail -15 "$OUT/sanitizer-$tool.log"; }
  done
fi
echo "kvq-gpu: done in $(( $(date +%s) - start )) s"
python3 bench/gpu/summarize.py "$OUT"
