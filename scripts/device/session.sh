#!/usr/bin/env bash
# One-off (2026-12-03, second session): the record of HEAD and the DeltaNet prefill tile sweep, in one call.
# verify (fast path, full size), the DeltaNet kernels' sweep (the chunk solve's warps, the state loop's BV),
# then the HTTP table (serve_bench.sh). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
TAILN=14 run verify 300 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
TAILN=60 run gdn_sweep 150 python3 -m hyserve.kernels.gated_delta_rule.bench --sweep
cp $W/gdn_sweep.log "$OUT/"
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95
cp $W/*.log "$OUT/" 2> /dev/null
