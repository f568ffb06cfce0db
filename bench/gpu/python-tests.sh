#!/usr/bin/env bash
# The Python package's tests on the GPU machine, in one device call after bench/gpu/run.sh (or alone): pip install
# of the package with the CUDA backend into the machine's Python (torch, transformers, nanobind, scikit-build-core,
# pytest and accelerate are there; no network), then every test of tests/python: the device cache and kvq.hf on
# CUDA, and the CPU tests again under the machine's transformers (5.17 when this was written). Writes $OUT/python.log.
#   device:   run(command="bash bench/gpu/python-tests.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/python.log") 2>&1
start=$(date +%s)
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
  "cuda devices", torch.cuda.device_count())'
# The system compiler: the image's CXX (/opt/gcc) links libstdc++ statically, and an extension holding its own
# libstdc++ in a process that loads the shared one (numpy, torch) crashes in the locale code of std::ostream (seen
# as a segmentation fault in CodecSpec::str, session of 2026-12-01).
CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q \
  --no-build-isolation --no-deps -Cbuild-dir=build/python-gpu -Ccmake.define.KVQ_CUDA=ON . ||
  { echo "kvq-gpu: pip install failed"; exit 1; }
echo "kvq-gpu: python package built in $(( $(date +%s) - start )) s"
# From another folder, so that python/kvq in the clone cannot shadow the installed package.
(cd tests/python && PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider -rs --rootdir=. .)
status=$?
echo "kvq-gpu: python tests done in $(( $(date +%s) - start )) s (pytest exit $status)"
exit $status
