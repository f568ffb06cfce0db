#!/usr/bin/env bash
# A candidate tree against this checkout in one device call: the candidate's GPU tests (and compute-sanitizer
# memcheck on a filter), then the same decode pairs and append codecs timed with both builds, shape by shape in
# turn, so that every ratio comes from one run. For a branch that waits for a GPU:
#   here:    bash bench/gpu/pack-deps.sh; echo /.candidate/ >>.git/info/exclude
#            rm -rf .candidate && mkdir .candidate && git archive BRANCH | tar -x -C .candidate
#   device:  run(command="bash bench/gpu/compare.sh .candidate", carry=[".gpu-deps", ".candidate"])
# KVQ_COMPARE_PAIRS (--k/--v arguments), KVQ_COMPARE_SHAPES (BxN ...), KVQ_COMPARE_CODECS (append codecs) and
# KVQ_MEMCHECK_FILTER choose what runs; KVQ_SANITIZE=0 skips memcheck. Writes run.log, decode-{base,candidate}.jsonl,
# append-{base,candidate}.jsonl and logs.tar.gz under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
candidate=${1:?usage: bench/gpu/compare.sh CANDIDATE_TREE}
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
start=$(date +%s)
elapsed() { echo "kvq-compare: $1 at $(( $(date +%s) - start )) s"; }

ln -sfn "$PWD/.gpu-deps" "$candidate/.gpu-deps"
for tree in . "$candidate"; do
  (cd "$tree" && cmake --preset cuda-device -Wno-dev -Wno-deprecated >/dev/null &&
    cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >>"$OUT/build.log") ||
    { tail -50 "$OUT/build.log"; exit 1; }
done
elapsed "both trees built"
"$candidate/build/cuda-device/tests/kvq_gpu_tests" --gtest_brief=1 2>&1 | tail -40
elapsed "candidate tests done"

read -ra pairs <<<"${KVQ_COMPARE_PAIRS:---k int4 --v int4 --k vecinfer:8/4 --v vecinfer:8/4 --k vecinfer:10/4 \
--v vecinfer:10/4 --k vecinfer:12/8 --v vecinfer:12/8}"
read -ra shapes <<<"${KVQ_COMPARE_SHAPES:-1x4096 8x32768 32x131072}"
read -ra codecs <<<"${KVQ_COMPARE_CODECS:-int4 qjl turbo_prod:3 vecinfer:8/4 vecinfer:12/8}"
codec_args=()
for c in "${codecs[@]}"; do codec_args+=(--codec "$c"); done
: >"$OUT/decode-base.jsonl"
: >"$OUT/decode-candidate.jsonl"
for shape in "${shapes[@]}"; do
  b=${shape%x*} n=${shape#*x}
  for side in base candidate; do
    tree=.
    [ "$side" = candidate ] && tree=$candidate
    timeout 120 "$tree/build/cuda-device/kvq" bench attention --device cuda --batch "$b" --ctx "$n" "${pairs[@]}" \
      --reps 30 --json >>"$OUT/decode-$side.jsonl" || echo "kvq-compare: $side decode $shape failed"
  done
done
elapsed "decode timing done"
for side in base candidate; do
  tree=.
  [ "$side" = candidate ] && tree=$candidate
  timeout 120 "$tree/build/cuda-device/kvq" bench append --device cuda --batch 32 --chunk 4096 "${codec_args[@]}" \
    --json >"$OUT/append-$side.jsonl" || echo "kvq-compare: $side append failed"
done
elapsed "append timing done"

if [ "${KVQ_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 1 "$candidate/build/cuda-device/tests/kvq_gpu_tests" \
    --gtest_brief=1 --gtest_filter="${KVQ_MEMCHECK_FILTER:-CudaAppend.EveryCodec*:CudaAppend.VecInferNearTies*}" \
    >"$OUT/sanitizer-memcheck.log" 2>&1 && echo "kvq-compare: compute-sanitizer memcheck: clean" ||
    { echo "kvq-compare: compute-sanitizer memcheck FAILED or timed out"; tail -15 "$OUT/sanitizer-memcheck.log"; }
  elapsed "memcheck done"
fi
(cd "$OUT" && shopt -s nullglob && logs=(build.log sanitizer-*.log) && [ ${#logs[@]} -gt 0 ] &&
  tar czf logs.tar.gz --remove-files -- "${logs[@]}")
