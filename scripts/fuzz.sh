#!/usr/bin/env bash
# Runs libFuzzer targets (fuzz/<target>_fuzzer.cpp) for a bounded time:
#   scripts/fuzz.sh [-j JOBS] [--prebuilt] TARGET|all SECONDS [libFuzzer args...]
# e.g. scripts/fuzz.sh gguf 600, scripts/fuzz.sh -j 2 all 30, scripts/fuzz.sh cache_payload 0 -runs=10000000.
# Configures and builds the fuzz preset (clang) where needed. Each target starts from its committed corpus
# fuzz/corpus/<target>/ and build/fuzz/corpus/<target>/, where new inputs go (the committed corpus is never
# written), with fuzz/<target>.dict where there is one; -j runs that many targets at a time (each one process).
# Prints per target the executions, exec/s and libFuzzer's coverage (cov: edges, ft: features); logs and crashing
# inputs land in build/fuzz/logs/ and build/fuzz/artifacts/<target>/. Exits non-zero if any target found a crash,
# hang (-timeout, 10 s per input), leak, out-of-memory or sanitizer report. --prebuilt runs the binaries already in
# build/fuzz/fuzz/ without configuring or building (a copy of the repository with the binaries, on a host without
# clang: they need glibc 2.34, docs/RELIABILITY.md).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=1 prebuilt=0
if [ "${1:-}" = "-j" ]; then
  jobs=$2
  shift 2
fi
if [ "${1:-}" = "--prebuilt" ]; then
  prebuilt=1
  shift
fi
if [ $# -lt 2 ]; then
  echo "usage: scripts/fuzz.sh [-j JOBS] [--prebuilt] TARGET|all SECONDS [libFuzzer args...]" >&2
  exit 2
fi
target=$1 seconds=$2
shift 2
extra=("$@")

all=()
for f in fuzz/*_fuzzer.cpp; do
  name=${f#fuzz/}
  all+=("${name%_fuzzer.cpp}")
done
if [ "$target" = all ]; then
  targets=("${all[@]}")
elif [ -f "fuzz/${target}_fuzzer.cpp" ]; then
  targets=("$target")
else
  echo "kvq: unknown fuzz target '$target' (targets: ${all[*]})" >&2
  exit 2
fi

build=build/fuzz
if ((prebuilt)); then
  for t in "${targets[@]}"; do
    [ -x "$build/fuzz/kvq_${t}_fuzzer" ] || { echo "kvq: --prebuilt: no $build/fuzz/kvq_${t}_fuzzer" >&2; exit 2; }
  done
else
  [ -f "$build/CMakeCache.txt" ] || nice -n 10 cmake --preset fuzz >/dev/null
  nice -n 10 cmake --build --preset fuzz >"$build/fuzz-build.log" 2>&1 || { cat "$build/fuzz-build.log"; exit 1; }
fi

# The tokenizer shared beside the repository is an extra seed where present (the corpus holds its first 2 KB;
# stories260K.bin, 1 MB, would raise libFuzzer's input size limit to its size and slow every target down).
declare -A seeds=([llama2c_tokenizer]=../shared/data/models/tok512.bin)

run_target() {
  local t=$1 log=$build/logs/$1.log
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t" "$build/logs"
  local args=(-max_total_time="$seconds" -timeout=10 -print_final_stats=1 -artifact_prefix="$build/artifacts/$t/")
  [ -f "fuzz/$t.dict" ] && args+=(-dict="fuzz/$t.dict")
  [ -n "${seeds[$t]:-}" ] && [ -f "${seeds[$t]}" ] && args+=(-seed_inputs="${seeds[$t]}")
  nice -n 10 "$build/fuzz/kvq_${t}_fuzzer" "${args[@]}" "${extra[@]}" "$build/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1
}

summary() {
  local t=$1 rc=$2 log=$build/logs/$1.log
  local runs rate cov ft  # absent where libFuzzer stopped before fuzzing (a bad flag or dictionary)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  if [ -z "$runs" ]; then  # -fork=N prints no final stats: its last status line
    runs=$( (grep -o '^#[0-9]*' "$log" || true) | tail -1 | tr -d '#')
    rate=$( (grep -o 'exec/s:\? [0-9]*' "$log" || true) | tail -1 | grep -o '[0-9]*$' || true)
  fi
  cov=$( (grep -o 'cov: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
  ft=$( (grep -o 'ft: [0-9]*' "$log" || true) | tail -1 | cut -d' ' -f2)
  printf 'kvq fuzz %-18s %10s executions %7s exec/s  cov %5s  ft %6s  %s inputs in %s\n' "$t" "${runs:-?}" \
    "${rate:-?}" "${cov:-?}" "${ft:-?}" "$(ls "$build/corpus/$t" | wc -l)" "$build/corpus/$t"
  if [ "$rc" != 0 ]; then
    echo "kvq fuzz $t FAILED (exit $rc): the report, from $log:"
    awk '/ERROR|[Ee]rror in|runtime error|kvq fuzz check failed|deadly signal|==[0-9]+==/ { on = 1 } on' "$log" |
      head -80
    ls "$build/artifacts/$t"/* 2>/dev/null | sed 's/^/  input: /'
  fi
}

failed=()
declare -A running=()
finish_one() {
  local pid rc=0
  wait -n -p pid "${!running[@]}" || rc=$?
  summary "${running[$pid]}" "$rc"
  [ "$rc" = 0 ] || failed+=("${running[$pid]}")
  unset "running[$pid]"
}
for t in "${targets[@]}"; do
  ((${#running[@]} < jobs)) || finish_one
  run_target "$t" &
  running[$!]=$t
done
while ((${#running[@]} > 0)); do finish_one; done

if ((${#failed[@]})); then
  echo "kvq fuzz: ${failed[*]} failed"
  exit 1
fi
