#!/usr/bin/env bash
# The Python package's tests, the stage of scripts/test.sh after the C++ release tests: a virtual environment in
# build/venv, pip install of the package and of the test requirements, then pytest (tests/python).
# The extension is built without the CUDA backend: the release build has already compiled it where nvcc exists,
# and compiling it a second time would cost many minutes. Its build folder (build/python/) is kept between runs.
# tests/python/requirements.txt adds torch, transformers and gguf from PyPI, for the DLPack and kvq.hf tests:
# torch's wheel brings CUDA libraries, 2-3 minutes to download and install here and 5.3 GB in the venv;
# KVQ_TEST_TORCH=0 leaves them out (those tests skip).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
venv=build/venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# The build requirements (pyproject.toml's [build-system]) in the venv itself: the build runs in it, without pip's
# isolated environment, so that CMake's cache stays valid between runs.
"$venv/bin/pip" install -q "scikit-build-core>=0.10" "nanobind>=2.2"
if [ "${KVQ_TEST_TORCH:-1}" = 1 ]; then "$venv/bin/pip" install -q -r tests/python/requirements.txt; fi
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$venv/bin/pip" install -q --no-build-isolation \
  --config-settings=cmake.define.KVQ_CUDA=OFF --config-settings=cmake.define.KVQ_WERROR=ON ".[test]"
"$venv/bin/python" -m pytest -q tests/python
echo "kvq: python tests done in $(( $(date +%s) - start )) s"
