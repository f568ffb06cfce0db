#!/usr/bin/env bash
# Sets up, builds and runs every test: the Release build (warnings are errors), then the same tests under
# AddressSanitizer + UndefinedBehaviorSanitizer.
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
echo "kvq: release tests done in $(( $(date +%s) - start )) s"
cmake --preset asan >/dev/null
cmake --build --preset asan --target kvq_tests kvq_tool
ctest --preset asan
echo "kvq: all tests done in $(( $(date +%s) - start )) s"
