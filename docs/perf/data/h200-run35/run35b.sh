#!/usr/bin/env bash
# Run 35b: ncu source counters (-lineinfo) of the int4, kivi:2 and turbo_mse:3 encoders after run 35a's changes,
# and a third append timing. Builds the branch's tree from .append-tile/src.tar.gz with .append-tile/.gpu-deps.
set -uo pipefail
start=$(date +%s)
B=/tmp/b2; rm -rf "$B"; mkdir -p "$B"
tar xzf .append-tile/src.tar.gz -C "$B" && cp -r .append-tile/.gpu-deps "$B/.gpu-deps" || { echo "unpack failed"; exit 1; }
cd "$B"
cmake --preset cuda-device -Wno-dev -Wno-deprecated -DCMAKE_CUDA_FLAGS=-lineinfo >/dev/null
cmake --build build/cuda-device -j "$(nproc)" --target kvq_tool >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
timeout 100 build/cuda-device/kvq bench append --device cuda --batch 32 --chunk 4096 --json > "$OUT/append3.jsonl" || echo "append bench failed"
python3 - "$OUT/append3.jsonl" <<'PY'
import json, sys
r = {x["codec"]: x for line in open(sys.argv[1]) for x in json.loads(line)["rows"] if x["mode"] == "prefill"}
for c in r: print(f'{c:14s} {r[c]["us_per_call"]:9.1f} us ({r[c]["bw_fraction"]:.3f}, {r[c]["us_per_call"] / r["f16"]["us_per_call"]:.2f}x f16)')
PY
echo "timed at $(( $(date +%s) - start )) s"
for c in int4 kivi:2 turbo_mse:3; do
  n=${c%%:*}
  timeout 100 ncu --set full --import-source yes -k regex:encode_pages --launch-skip 1 --launch-count 1 -f -o "$OUT/enc-$n" \
    build/cuda-device/kvq bench append --device cuda --batch 32 --chunk 4096 --codec "$c" --reps 1 > "$OUT/ncu-$n.log" 2>&1 || echo "ncu $c failed"
  ncu -i "$OUT/enc-$n.ncu-rep" --page source --csv --print-source cuda,sass 2>/dev/null | gzip > "$OUT/src-$n.csv.gz"
  ncu -i "$OUT/enc-$n.ncu-rep" --page details 2>/dev/null | grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|Executed Ipc A|Registers Per|Achieved Occupancy" | head -8
  rm -f "$OUT/enc-$n.ncu-rep"
  echo "$c at $(( $(date +%s) - start )) s"
done
tar czf "$OUT/logs.tar.gz" -C "$OUT" build.log ncu-int4.log ncu-kivi.log ncu-turbo_mse.log 2>/dev/null && rm -f "$OUT"/build.log "$OUT"/ncu-*.log
echo "done in $(( $(date +%s) - start )) s"
