#!/usr/bin/env bash
# Static SASS of append encoders (sm_90): per kernel its registers and spills (ptxas -v), its instruction count, the
# IEEE divisions' marks (FCHK: a division's range check; MUFU: reciprocals, square roots; CALL: slow paths) and
# every loop (a backward branch's span: inner loops first, then the loops around them) with its instruction count.
# Runs anywhere nvcc and cuobjdump are (no GPU; where the toolkit lacks cuobjdump and nvdisasm, the PyPI packages
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm bring them):
#   bash bench/gpu/encode-sass.sh [src/cuda/encode_int_group.cu ...]   (default: the int8/int4 encoder)
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for src in "${@:-src/cuda/encode_int_group.cu}"; do
  obj="$tmp/$(basename "$src").o"
  echo "== $src"
  "$NVCC" -O3 -DNDEBUG --generate-code=arch=compute_90,code=sm_90 -std=c++20 -Iinclude -Isrc -Xptxas -v \
    -Xptxas=-warn-spills -c "$src" -o "$obj" 2>&1 | grep -E "spill|Used" | sed 's/^ *//; s/ptxas info *: //'
  cuobjdump -sass "$obj" | python3 -c '
import collections, re, sys
kernels, name = {}, None
for line in sys.stdin:
    m = re.search(r"Function : (\S+)", line)
    if m:
        name = m.group(1); kernels[name] = []; continue
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)[^;]*);", line)
    if name and m:
        kernels[name].append((int(m.group(1), 16), m.group(2), m.group(3).split(".")[0]))
marks = ("FCHK", "MUFU", "CALL", "FFMA", "FMUL", "FADD", "DFMA", "DMUL", "DADD", "FMNMX", "FRND", "F2I", "F2F", "LDS",
         "STS", "LDG", "SHFL")
def summary(ins):
    ops = collections.Counter(op for _, _, op in ins)
    return " ".join(f"{o}:{ops[o]}" for o in marks if ops[o])
for name, ins in kernels.items():
    print(f"{name[:110]}\n  {len(ins)} instructions  {summary(ins)}")
    at = {a: i for i, (a, _, _) in enumerate(ins)}
    loops = []
    for i, (a, text, op) in enumerate(ins):
        t = re.search(r"BRA[^0x]*0x([0-9a-f]+)", text)
        if op == "BRA" and t and int(t.group(1), 16) <= a and int(t.group(1), 16) in at:
            loops.append((at[int(t.group(1), 16)], i))
    for s, e in sorted(loops, key=lambda l: l[1] - l[0]):
        print(f"  loop {ins[s][0]:05x}-{ins[e][0]:05x} {e - s + 1:5d}  {summary(ins[s:e + 1])}")
'
done
