#!/usr/bin/env bash
# Registers, spills and static shared memory of every CUDA kernel (nvcc -Xptxas -v, sm_90), one line per kernel.
# Runs anywhere nvcc is (no GPU needed): bash bench/gpu/ptxas-report.sh > docs/perf/ptxas-h200.txt
set -euo pipefail
cd "$(dirname "$0")/../../src"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
for f in cuda/decode_pair_*.cu cuda/decode_attention.cu; do
  "$NVCC" -O3 -DNDEBUG --generate-code=arch=compute_90,code=sm_90 -std=c++20 -I../include -I. -Xptxas -v \
    -c "$f" -o /dev/null 2>&1 | python3 -c '
import re, sys
name = None
for line in sys.stdin:
    m = re.search(r"Compiling entry function \x27(\w+)\x27", line) or re.search(r"Function properties for (\w+)", line)
    if m: name = m.group(1); continue
    m = re.search(r"Used (\d+) registers.*", line)
    if m and name:
        traits = r"(Float|Int|Kivi|TurboMse|TurboProd|Qjl|VecInfer)TraitsIL(b|i)(\w+?)EE"
        k = re.search(traits + r"3KeyE.*Li(\d+)ELi(\d+)EEEv", name)
        v = re.search(traits + r"5ValueE", name.split("3KeyE", 1)[-1])
        codec = {"Float0": "f16", "Float1": "bf16", "Int4": "int4", "Int8": "int8", "Kivi2": "kivi:2",
                 "TurboMse3": "turbo_mse:3", "TurboProd4": "turbo_prod:4", "Qjl0": "qjl", "Qjl256": "qjl:256",
                 "VecInfer8ELi4": "vecinfer:8/4", "VecInfer10ELi4": "vecinfer:10/4"}
        if k:
            key = codec.get(k.group(1) + k.group(3), k.group(1) + k.group(3))
            value = codec.get(v.group(1) + v.group(3), v.group(1) + v.group(3)) if v else key
            pair = key if value == key else key + chr(47) + value
            label = f"split {pair} d={k.group(4)}"
            if k.group(1) == "Int":
                label += f" G={16 << int(k.group(5))}"
        else:
            label = re.search(r"([a-z][a-z_]*_kernel)", name).group(1)
        stats = re.sub(r"ptxas info\s*:\s*", "", line.strip())
        print(f"{label:36s} {stats}")
        name = None
'
done
