#!/usr/bin/env bash
# Gathers what the GPU machine lacks for a build (it has nvcc, CMake and ninja but no Debian -dev packages and no
# network): GoogleTest's sources and the CLI11 and nlohmann-json headers with their CMake package files, into
# .gpu-deps/ (git-ignored; a device call carries it). Run here before bench/gpu/run.sh goes to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu-deps && mkdir -p .gpu-deps/include .gpu-deps/share/cmake
cp -r /usr/src/googletest .gpu-deps/googletest
cp -r /usr/include/nlohmann /usr/include/CLI .gpu-deps/include/
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 .gpu-deps/share/cmake/
du -sh .gpu-deps
