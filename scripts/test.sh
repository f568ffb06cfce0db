#!/usr/bin/env bash
# Sets up, builds and runs every test: the Release build (warnings are errors) and the installed package, the
# Python package's tests (scripts/test-python.sh), the same C++ tests under AddressSanitizer +
# UndefinedBehaviorSanitizer, a short run of every fuzz target, then the NEON kernels cross-built for AArch64 and run
# under qemu.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The CUDA backend is compiled (not run) wherever the toolkit is installed.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
scripts/fetch-models.sh
start=$(date +%s)
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release
# The installed package as a user's project sees it: examples/cpp built with find_package(kvq) and run.
rm -rf build/install build/example
cmake --install build/release --prefix build/install >/dev/null
cmake -S examples/cpp -B build/example -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/example
(cd build/example && ./cache_example)
echo "kvq: release tests done in $(( $(date +%s) - start )) s"
scripts/test-python.sh
# -O1 -g1 (CMakePresets.json): the instrumented build compiles in about 0.6 of the time of -O2 -g, with line numbers
# in the reports. The gtest suite runs as two shard processes rather than a thousand ctest processes (an instrumented
# process takes about 0.1 s to start and exit), beside the command-line tests and the replays of the fuzz corpora
# (ctest; a model pass under ASan takes over a minute).
cmake --preset asan >/dev/null
cmake --build --preset asan --target kvq_tests kvq_tool kvq_fuzz_replays
logs=(build/asan/cli.log build/asan/shard0.log build/asan/shard1.log)
ctest --preset asan -R '^(cli|fuzz)\.' -j1 >"${logs[0]}" 2>&1 &
pids=($!)
for shard in 0 1; do
  GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$shard build/asan/tests/kvq_tests --gtest_brief=1 >"${logs[shard + 1]}" 2>&1 &
  pids+=($!)
done
failed=0
for i in 0 1 2; do
  if wait "${pids[i]}"; then grep -E "tests passed|PASSED|SKIPPED" "${logs[i]}" || true; else failed=1; cat "${logs[i]}"; fi
done
[ "$failed" = 0 ] || { echo "kvq: sanitizer tests failed (logs above)"; exit 1; }
echo "kvq: sanitizer tests done in $(( $(date +%s) - start )) s"
# Fuzzing: every target of fuzz/ (clang; coverage, ASan, UBSan; only the library and the targets are built) for
# 30 s, two at a time on the two cores, from its committed corpus; a crash, hang, leak or sanitizer report fails.
# Deeper runs: scripts/fuzz.sh TARGET SECONDS (docs/RELIABILITY.md).
scripts/fuzz.sh -j 2 all 30
echo "kvq: fuzzing done in $(( $(date +%s) - start )) s"
# AArch64: only the kernel tests (the whole suite under qemu takes far too long), in one qemu process: the fused
# kernels of every instruction set against the scalar kernel and the reference, and the contracts of the codecs
# whose blocks they read. Where the cross compiler or qemu is missing, skipped with a note.
if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then
  cmake --preset aarch64 >/dev/null
  cmake --build --preset aarch64 --target kvq_kernel_tests
  codecs='*/CodecContract.*/f16_*:*/CodecContract.*/int8*:*/CodecContract.*/int4*:CodecRegistry.*:CodecSpec.*'
  qemu-aarch64 -L /usr/aarch64-linux-gnu build/aarch64/tests/kvq_kernel_tests \
    --gtest_filter="AttentionKernel*:IntGroup*:Half.*:Bitpack.*:$codecs"
else
  echo "kvq: no aarch64-linux-gnu-g++ or qemu-aarch64: the NEON kernel tests did not run"
fi
echo "kvq: all tests done in $(( $(date +%s) - start )) s"
