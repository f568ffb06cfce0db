#!/usr/bin/env bash
# Installs what kvq needs to build and test on Debian 12 (as root, or with sudo available).
set -euo pipefail
# g++-aarch64-linux-gnu and qemu-user: the NEON kernels' tests, cross-built and run under qemu (scripts/test.sh).
# python3-dev and python3-venv: the Python package, built and tested in a virtual environment (scripts/test-python.sh).
# clang-14 and libclang-rt-14-dev (libFuzzer, the sanitizers' runtimes): the fuzz targets (scripts/fuzz.sh).
packages=(build-essential cmake pkg-config libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
          python3 python3-pip python3-dev python3-venv g++-aarch64-linux-gnu qemu-user clang-14 libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kvq: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
