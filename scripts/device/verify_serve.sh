#!/usr/bin/env bash
# The accuracy gate and the issue-4 HTTP table at this commit (~8 min from a cold machine): `hyserve verify` on
# the fast path at full size (dummy weights), then scripts/device/serve_bench.sh. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=8 run verify 300 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast
bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 2>&1 \
  | grep -v "^hyserve:" | tail -n 40
