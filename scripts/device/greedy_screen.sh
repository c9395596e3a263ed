#!/usr/bin/env bash
# The greedy screen of the LM head on the H200 (~8 min from a cold machine): its GPU tests (kernel against the
# full head at 248320 x 2048, the engine's captured greedy-only graphs against --no-greedy-screen), the
# micro-benchmark over every screen plan at 1, 2, 4 and 8 rows, then the batch-1 and batch-4 decode step
# with the screen and without. Logs in $OUT.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=6 run tests 240 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/greedy_head \
  src/hyserve/kernels/argmax tests/test_greedy_screen.py
TAILN=40 run bench 150 python3 -m hyserve.kernels.greedy_head.bench --rows 1,2,4 --sweep
args="--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 8192 --prompt-len 384
  --cuda-graph-sizes 1,4 --prefill-graph-sizes none --batch 1,4 --steps 30 --no-warmup --top 12"
TAILN=12 run prof_screen 150 python3 scripts/profile_decode.py $args
TAILN=12 run prof_full 150 python3 scripts/profile_decode.py $args --no-greedy-screen
grep -E "greedy|screen" "$W/prof_screen.log" | head -n 5
