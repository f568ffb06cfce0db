#!/usr/bin/env bash
# Prints the markdown table of docs/METHODS.md: `kvq distortion` for every codec and bit width at d = 128.
# Usage: scripts/distortion-table.sh [N] [SEED]   (build first: cmake --build --preset release --target kvq_tool)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10000}
seed=${2:-1}
kvq=build/release/kvq
specs=(f16 bf16 int8 int8:16 int4 int4:16 kivi:4 kivi:2 turbo_mse:1 turbo_mse:2 turbo_mse:3 turbo_mse:4
       turbo_prod:2 turbo_prod:3 turbo_prod:4 qjl qjl:256 turbo_rvq:1 turbo_rvq:2 vecinfer:8/4 vecinfer:8/4,norm=1 vecinfer:10/4
       vecinfer:12/8 vecinfer:8/8)
echo "| codec | bits/element | mse | ip_bias | ip_bias s.e. | ip_mse_d |"
echo "|---|---|---|---|---|---|"
for s in "${specs[@]}"; do
  "$kvq" distortion --codec "$s" --dim 128 --n "$n" --seed "$seed" --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("| `%s` | %.4f | %.4g | %+.3g | %.2g | %.4g |" % (r["codec"], r["bits_per_element"], r["mse"], r["ip_bias"], r["ip_bias_stderr"], r["ip_mse_d"]))'
done
