#!/usr/bin/env bash
# Run 35a: the append kernels' tile pass by fixed channels (no division per quad, one finiteness predicate per quad),
# int and kivi items by shifts and unrolled group shuffles: every GPU test on the default pairs, append timing twice,
# the append and device-cache tests under memcheck, the append shapes under racecheck. Builds the branch's tree from
# .append-tile/src.tar.gz (git archive) with .append-tile/.gpu-deps, wherever the call's working tree comes from.
set -uo pipefail
start=$(date +%s)
echo "tree sent: $(git log -1 --oneline 2>/dev/null | cut -c1-60)"
B=/tmp/b; rm -rf "$B"; mkdir -p "$B"
tar xzf .append-tile/src.tar.gz -C "$B" && cp -r .append-tile/.gpu-deps "$B/.gpu-deps" || { echo "unpack failed"; exit 1; }
cd "$B"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
cmake --preset cuda-device -Wno-dev -Wno-deprecated >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_gpu_tests kvq_tool >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 2>&1 | grep -v "bytes differ" | tail -8
echo "tests at $(( $(date +%s) - start )) s"
for n in 1 2; do timeout 100 build/cuda-device/kvq bench append --device cuda --batch 32 --chunk 4096 --json > "$OUT/append$n.jsonl" || echo "append bench failed"; done
python3 - "$OUT/append1.jsonl" "$OUT/append2.jsonl" <<'PY'
import json, sys
runs = [{r["codec"]: r for line in open(f) for r in json.loads(line)["rows"] if r["mode"] == "prefill"} for f in sys.argv[1:]]
for c in runs[0]:
    print(f'{c:14s}' + "".join(f' {r[c]["us_per_call"]:9.1f} us ({r[c]["bw_fraction"]:.3f}, {r[c]["us_per_call"] / r["f16"]["us_per_call"]:.2f}x f16)' for r in runs if c in r))
PY
echo "timed at $(( $(date +%s) - start )) s"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.*:CudaDeviceCache.*-CudaDeviceCache.AppendsMatchTheHostCache' > "$OUT/memcheck.log" 2>&1 && echo "memcheck clean" || { echo "memcheck FAILED or timed out"; tail -8 "$OUT/memcheck.log"; }
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 1 build/cuda-device/tests/kvq_gpu_tests --gtest_brief=1 --gtest_filter='CudaAppend.SanitizerShapes*' > "$OUT/racecheck.log" 2>&1 && echo "racecheck clean" || { echo "racecheck FAILED or timed out"; tail -8 "$OUT/racecheck.log"; }
echo "sanitized at $(( $(date +%s) - start )) s"
tar czf "$OUT/logs.tar.gz" -C "$OUT" build.log memcheck.log racecheck.log 2>/dev/null && rm -f "$OUT"/{build,memcheck,racecheck}.log
echo "done in $(( $(date +%s) - start )) s"
