#!/usr/bin/env bash
# The whole GPU job in one device call: build for sm_90, run the GPU tests, time PyTorch SDPA (bf16, GQA) and
# every kvq CUDA kernel over batch {1, 8, 32} x ctx {4096, 32768, 131072} with the device's copy bandwidth, time the
# append kernels per codec (append.jsonl), run the GPU tests under compute-sanitizer memcheck and racecheck, and
# print the tables last. Everything it prints is also written under $OUT (run.log, kvq.jsonl, hot.jsonl, append.jsonl,
# sdpa.jsonl, exact.jsonl, summary.json; build.log, sass.txt, the sanitizer and ncu logs in logs.tar.gz). The timing
# runs each pair's default kernel (KVQ_ATTENTION unset: int keys on the integer path), plus the exact path of
# int4/int4 and int8/int8 at 32 x 32768 (exact.jsonl) for comparison.
#   here:     bash bench/gpu/pack-deps.sh
#   device:   run(command="bash bench/gpu/run.sh", carry=[".gpu-deps"])
# KVQ_GPU_QUICK=1 times two shapes only (1 x 4096, 32 x 131072); KVQ_CUDA_ALL_PAIRS=1 builds (and tests) every
# key codec with every value codec (src/cuda/decode_pairs.cmake); KVQ_MEMCHECK_FILTER and KVQ_RACECHECK_FILTER pick
# the sanitized tests (racecheck by default the decode tests and the append test in reduced shapes: the other
# append tests take over 7 minutes under it, run 13, and CudaDeviceCache.AppendsMatchTheHostCache 207 s, run 29),
# KVQ_SANITIZE=0 skips them; KVQ_NCU="batch ctx codec kernel-regex[;...]" adds an ncu profile of one launch of each
# pair's split kernel (ncu-<n>-<codec>-<batch>x<ctx>.txt; the regex matches the mangled name, e.g. "32 32768 int4 IntTraitsILi4EE3Key").
# The split kernels' SASS opcode counts go to sass.txt (bench/gpu/sass_stats.py; about a minute, KVQ_GPU_SASS=0
# skips it).
set -uo pipefail
cd "$(dirname "$0")/../.."
unset KVQ_ATTENTION  # the default kernels (the tests choose their own)
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
# A device call returns at most 8 files: the logs go back as one archive beside run.log and the JSON files, packed
# also when the call is stopped early (a TERM waits for the running step, each step having its own timeout).
pack_logs() {
  local logs=() f
  shopt -s nullglob
  for f in "$OUT"/{build.log,sass.txt} "$OUT"/sanitizer-*.log "$OUT"/ncu-*.txt; do
    if [ -f "$f" ]; then logs+=("${f##*/}"); fi
  done
  if [ ${#logs[@]} -gt 0 ]; then tar czf "$OUT/logs.tar.gz" -C "$OUT" --remove-files -- "${logs[@]}"; fi
}
trap pack_logs EXIT
trap 'echo "kvq-gpu: stopped"; exit 124' TERM INT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader || true
start=$(date +%s)
all_pairs=OFF
[ "${KVQ_CUDA_ALL_PAIRS:-0}" = 1 ] && all_pairs=ON
cmake --preset cuda-device -Wno-dev -Wno-deprecated -DKVQ_CUDA_ALL_PAIRS=$all_pairs >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" ||
  { tail -50 "$OUT/build.log"; exit 1; }
echo "kvq-gpu: built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 2>&1 | tail -40
echo "kvq-gpu: tests done at $(( $(date +%s) - start )) s"

: >"$OUT/kvq.jsonl"
pairs=(--k int4 --v int4 --k int8 --v int8 --k f16 --v f16 --k kivi:2 --v kivi:2 --k turbo_mse:3 --v turbo_mse:3
  --k kivi:4 --v kivi:4 --k turbo_mse:2 --v turbo_mse:2 --k turbo_mse:4 --v turbo_mse:4
  --k kivi:4 --v int4 --k turbo_mse:4 --v turbo_mse:2 --k int4 --v turbo_mse:2 --k f16 --v int4
  --k qjl --v qjl --k qjl --v int4 --k turbo_prod:4 --v int4 --k turbo_prod:4 --v turbo_mse:3
  --k vecinfer:8/4 --v vecinfer:8/4 --k vecinfer:10/4 --v vecinfer:10/4 --k turbo_rvq:2 --v turbo_rvq:2
  --k vecinfer:12/8 --v vecinfer:12/8 --k kivi:3 --v kivi:3 --k kivi:3 --v turbo_mse:2)
shapes=(1x4096 1x32768 1x131072 8x4096 8x32768 8x131072 32x4096 32x32768 32x131072)
[ "${KVQ_GPU_QUICK:-0}" = 1 ] && shapes=(1x4096 32x131072)
for shape in "${shapes[@]}"; do
  b=${shape%x*} c=${shape#*x}
  timeout 90 build/cuda-device/kvq bench attention --device cuda --batch "$b" --ctx "$c" "${pairs[@]}" --reps 30 \
    --json >>"$OUT/kvq.jsonl" || echo "kvq-gpu: kvq bench batch $b ctx $c failed"
done
# The same pairs with every sequence of the batch reading one sequence's pages (--hot: from L2): what the kernels
# take without the HBM traffic, so that the cold times above tell memory-bound from compute-bound.
timeout 90 build/cuda-device/kvq bench attention --device cuda --batch 32 --ctx 32768 "${pairs[@]}" --reps 30 --hot \
  --json >"$OUT/hot.jsonl" || echo "kvq-gpu: kvq bench --hot failed"
# The int keys' exact fp16 path (--exact: KVQ_ATTENTION=exact) beside their default integer path, at one shape.
timeout 60 build/cuda-device/kvq bench attention --device cuda --batch 32 --ctx 32768 --k int4 --v int4 --k int8 \
  --v int8 --reps 30 --exact --json >"$OUT/exact.jsonl" || echo "kvq-gpu: kvq bench --exact failed"
echo "kvq-gpu: kvq timing done at $(( $(date +%s) - start )) s"
# The append kernels: 32 sequences x one prefill chunk of 4096 tokens, and one token per sequence, each step as one
# batched call and as one call per sequence.
timeout 240 build/cuda-device/kvq bench append --device cuda --batch 32 --chunk 4096 --json >"$OUT/append.jsonl" ||
  echo "kvq-gpu: kvq bench append failed"
echo "kvq-gpu: append timing done at $(( $(date +%s) - start )) s"
PYTHONUNBUFFERED=1 timeout 180 python3 bench/gpu/sdpa_bench.py --shapes "${shapes[@]}" \
  >"$OUT/sdpa.jsonl" || echo "kvq-gpu: SDPA timing failed"
echo "kvq-gpu: SDPA timing done at $(( $(date +%s) - start )) s"

if [ -n "${KVQ_NCU:-}" ] && command -v ncu >/dev/null; then
  IFS=';' read -ra profiles <<<"$KVQ_NCU"
  for n in "${!profiles[@]}"; do
    profile=${profiles[$n]}
    read -r nb nc ncodec nregex <<<"$profile"
    timeout 240 ncu --clock-control none --kernel-name-base mangled -k "regex:$nregex" --launch-skip 5 \
      --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section SchedulerStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,dram__bytes_read.sum" \
      build/cuda-device/kvq bench attention --device cuda --batch "$nb" --ctx "$nc" --k "$ncodec" --v "$ncodec" \
      --reps 10 >"$OUT/ncu-$n-${ncodec%%:*}-${nb}x$nc.txt" 2>&1 || echo "kvq-gpu: ncu $ncodec failed"
  done
  echo "kvq-gpu: ncu done at $(( $(date +%s) - start )) s"
fi

[ "${KVQ_GPU_SASS:-1}" = 1 ] && command -v cuobjdump >/dev/null &&
  cuobjdump -sass build/cuda-device/tests/kvq_gpu_tests | python3 bench/gpu/sass_stats.py >"$OUT/sass.txt"

if [ "${KVQ_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  declare -A filter=([memcheck]="${KVQ_MEMCHECK_FILTER:-*}"
    [racecheck]="${KVQ_RACECHECK_FILTER:-CudaDecodeAttention.*:CudaFastDecode.ExactSelects*:CudaDeviceCache.*:CudaSlidingWindow.RepeatedRuns*:CudaAppend.SanitizerShapes*-CudaDeviceCache.AppendsMatchTheHostCache}")
  for tool in memcheck racecheck; do
    timeout 180 compute-sanitizer --tool "$tool" --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests \
      --gtest_brief=1 --gtest_filter="${filter[$tool]}" >"$OUT/sanitizer-$tool.log" 2>&1 &&
      echo "kvq-gpu: compute-sanitizer $tool: clean" ||
      { echo "kvq-gpu: compute-sanitizer $tool FAILED or timed out"; tail -15 "$OUT/sanitizer-$tool.log"; }
  done
fi
echo "kvq-gpu: done in $(( $(date +%s) - start )) s"
python3 bench/gpu/summarize.py "$OUT"
