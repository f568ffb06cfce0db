#!/usr/bin/env python3
"""Opcode counts of the decode split kernels in `cuobjdump -sass` output (stdin): one line per kernel with its
instruction count and most frequent opcodes, then the whole SASS of the int4 kernel at d = 128 for reading."""
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pair_label import pair_label  # noqa: E402

kernels, name = {}, None
for line in sys.stdin:
    m = re.search(r"Function : (\S+)", line)
    if m:
        name = m.group(1)
        kernels[name] = []
        continue
    m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
    if name and m:
        kernels[name].append((m.group(1), line.rstrip()))
for name, ins in kernels.items():
    if "decode_split_kernel" not in name:
        continue
    ops = collections.Counter(op.split(".")[0] for op, _ in ins)
    short = pair_label(name) or name
    print(f"{short:32s} {len(ins):6d} " + " ".join(f"{o}:{c}" for o, c in ops.most_common(28)))
for name, ins in kernels.items():
    if "IntTraitsILi4EE3KeyENS4_5ValueELi128ELi1E" in name:
        print("\n" + name)
        print("\n".join(line for _, line in ins))
