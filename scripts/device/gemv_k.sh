#!/usr/bin/env bash
# Whole-K GEMV tiles for the 2048 x 4096 projections (DeltaNet out_proj, attention o_proj): one or two W tiles
# per program, so under PDL most of a program's weights load before its wait. Sweep BLOCK_K 1024/2048/4096
# (linear/bench.py, isolated), merge the winner into gemv.json on the device, then the B=1 decode profile.
set -u
source "$(dirname "$0")/common.sh"
TAILN=6 run gemv 50 python3 -m hyserve.kernels.linear.bench --shapes 2048x4096 --block-k 1024,2048,4096 --write --merge
TAILN=0 run profile 70 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 4096 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup
grep -h "== batch" $W/profile.log
