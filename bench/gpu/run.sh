#!/usr/bin/env bash
# The whole GPU job in one device call: build for sm_90, run the GPU tests (plain, then under compute-sanitizer
# memcheck and racecheck), then time every kernel. Everything it prints is also written under $OUT.
#   here:     bash bench/gpu/pack-deps.sh
#   device:   run(command="bash bench/gpu/run.sh", carry=[".gpu-deps"])
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader || true
start=$(date +%s)
cmake --preset cuda-device -Wno-dev -Wno-deprecated >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" || { tail -50 "$OUT/build.log"; exit 1; }
echo "kvq-gpu: built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 \
      --gtest_filter="${KVQ_SANITIZE_FILTER:-*}" >"$OUT/sanitizer-$tool.log" 2>&1 &&
      echo "kvq-gpu: compute-sanitizer $tool: clean" || { echo "kvq-gpu: compute-sanitizer $tool FAILED"; tail -30 "$OUT/sanitizer-$tool.log"; }
  done
fi
echo "kvq-gpu: done in $(( $(date +%s) - start )) s"
