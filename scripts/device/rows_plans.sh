#!/usr/bin/env bash
# GEMV tiles of their own at 2 and 4 rows (~4 min from a cold machine): `linear.bench --rows-plans 2,4 --write`
# (by_rows and max_rows in gemv.json, copied to $OUT), then the B=1 / 2 / 4 decode steps with them.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=12 run rows_plans 150 python3 -m hyserve.kernels.linear.bench --rows-plans 2,4 --write
cp src/hyserve/kernels/linear/configs/gemv.json "$OUT/gemv.json"
args="--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 8192 --prompt-len 384
  --cuda-graph-sizes 1,2,4 --prefill-graph-sizes none --batch 1,2,4 --steps 30 --no-warmup --top 12"
TAILN=5 run prof 150 python3 scripts/profile_decode.py $args
