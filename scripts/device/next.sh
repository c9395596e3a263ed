#!/usr/bin/env bash
# Run on 2026-12-04 at 94e74b6 (docs/performance.md; the plans it wrote are 1e66758's). Prepared for the next session (~6 min from a cold machine): (1) the GEMV plans against cuBLAS at
# 1..4 rows (`linear.bench --max-rows --write`: at 4 rows the 80 GEMVs of the B=4 step add 2.1 ms against 0.8 at
# B=1, so some shapes may belong to cuBLAS from 2 rows on, as the LM head does); the written gemv.json comes back
# in $OUT; (2) the B=1 / 2 / 4 decode steps with those plans. scripts/device/ttft_gap.sh (~5 min, a call of its
# own) is the other prepared run.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=30 run max_rows 200 python3 -m hyserve.kernels.linear.bench --max-rows --write
cp src/hyserve/kernels/linear/configs/gemv.json "$OUT/gemv.json"
args="--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 8192 --prompt-len 384
  --cuda-graph-sizes 1,2,4 --prefill-graph-sizes none --batch 1,2,4 --steps 30 --no-warmup --top 12"
TAILN=6 run prof 200 python3 scripts/profile_decode.py $args
