#!/usr/bin/env bash
# Sets up, builds and runs the main job: `kvq demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-models.sh
cmake --preset release >/dev/null
cmake --build --preset release --target kvq_tool
exec build/release/kvq demo "$@"
