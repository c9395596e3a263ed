#!/usr/bin/env bash
# The issue-4 HTTP table and the accuracy gate at this commit (~7 min from a cold machine): first
# scripts/device/serve_bench.sh, so that on a fresh machine its start-up is the cold-cache one (the Triton
# cache's file count is printed first), then `hyserve verify` on the fast path at full size (dummy weights).
# FLAGS: engine flags for both (e.g. FLAGS=--mma-experts). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
echo "Triton cache before the start: $(find ~/.triton/cache -type f 2> /dev/null | wc -l) files"
bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 ${FLAGS:-} 2>&1 \
  | grep -v "^hyserve:" | tail -n 40
TAILN=8 run verify 300 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast ${FLAGS:-}
