#!/usr/bin/env bash
# The greedy screen's TMA option (~4 min from a cold machine): GPU tests, the micro-benchmark over every plan
# (pointer loads and TMA) at 1, 2 and 4 rows, then the batch-1 decode step with the committed plan and with
# the N=1 plan edited to (64, 128, 4 warps, TMA 4) on the device. Logs in $OUT.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=4 run tests 240 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/greedy_head
TAILN=40 run bench 150 python3 -m hyserve.kernels.greedy_head.bench --rows 1,2,4 --sweep
args="--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 8192 --prompt-len 384
  --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup --top 12"
TAILN=2 run prof_ptr 120 python3 scripts/profile_decode.py $args
grep -E "== batch|_limbs|_screen|_select" "$W/prof_ptr.log"
sed -i 's/^SCREEN_PLAN = {1: (64, 128, 4, 0),/SCREEN_PLAN = {1: (64, 128, 4, 4),/' src/hyserve/kernels/greedy_head/triton_kernel.py
grep -n "^SCREEN_PLAN" src/hyserve/kernels/greedy_head/triton_kernel.py
TAILN=2 run prof_tma 120 python3 scripts/profile_decode.py $args
grep -E "== batch|_limbs|_screen|_select" "$W/prof_tma.log"
