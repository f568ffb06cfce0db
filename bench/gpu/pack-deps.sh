#!/usr/bin/env bash
# Gathers what the GPU machine lacks (it has nvcc, CMake and ninja but no Debian -dev packages and no network): for
# the build, GoogleTest's sources and the CLI11 and nlohmann-json headers with their CMake package files; for
# bench/gpu/e2e.sh, the wheels of transformers' QuantizedCache backends that its Python (3.12, x86_64, with torch,
# transformers, accelerate, numpy, einops, tqdm, ninja, safetensors and huggingface-hub) lacks: optimum-quanto,
# hqq and hqq's termcolor. Into .gpu-deps/ (git-ignored; a device call carries it). Run here before bench/gpu/run.sh
# or e2e.sh goes to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu-deps && mkdir -p .gpu-deps/include .gpu-deps/share/cmake .gpu-deps/wheels
cp -r /usr/src/googletest .gpu-deps/googletest
cp -r /usr/include/nlohmann /usr/include/CLI .gpu-deps/include/
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 .gpu-deps/share/cmake/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .gpu-deps/wheels optimum-quanto==0.2.7 termcolor==3.3.0
# hqq is published as source only; its wheel is pure Python once its optional CUDA kernels are left out
# (DISABLE_CUDA=1: otherwise its setup.py builds and installs them into this machine's Python).
DISABLE_CUDA=1 python3 -m pip wheel -q --no-deps --no-binary hqq -w .gpu-deps/wheels hqq==0.2.8.post1
du -sh .gpu-deps
