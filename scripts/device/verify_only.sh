#!/usr/bin/env bash
# One-off (2026-12-03): the full-size verify of the fast path (record.sh's verify command) with the time it
# needs, then the qk_norm_rope tests on the GPU.
set -u
source "$(dirname "$0")/common.sh"
TAILN=16 run verify 420 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
TAILN=3 run tests 80 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/qk_norm_rope
tar czf "$OUT/results.tgz" -C $W .
