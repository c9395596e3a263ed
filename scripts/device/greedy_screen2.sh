#!/usr/bin/env bash
# The greedy screen after its first timing (~3 min from a cold machine): GPU tests, the micro-benchmark with the
# plans as committed, the batch-1 and batch-4 decode step with the screen. Logs in $OUT.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=4 run tests 240 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/greedy_head tests/test_greedy_screen.py
TAILN=5 run bench 100 python3 -m hyserve.kernels.greedy_head.bench --rows 1,2,4
args="--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 8192 --prompt-len 384
  --cuda-graph-sizes 1,4 --prefill-graph-sizes none --batch 1,4 --steps 30 --no-warmup --top 12"
TAILN=4 run prof_screen 150 python3 scripts/profile_decode.py $args
grep -E "== batch|_limbs|_screen|_select|_gemv" "$W/prof_screen.log"
