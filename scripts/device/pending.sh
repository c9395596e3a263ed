#!/usr/bin/env bash
# What is left to run on the H200 of the changes built on the CPU (17th session, 2026-12-04), one call each:
#   PART=1 (~3 min): scripts/check_prefill_graphs.py: the graph's first-token logprobs against the eager prefill's
#          and the run-to-run noise of each path (on 2026-12-05 the exact-size graphs differed from the eager
#          prefill by 0.25-0.48 nats on the dummy model, so the noise column was added to tell order-of-summation
#          noise from a wrong graph), and a plain greedy request's token (the LM head's greedy screen).
#   PART=2 (~6 min): the first token without HTTP, before (.base: `git archive 10fc263 src | tar -x -C .base`,
#          carried) against the tree, at LENS (128,1024): scripts/device/ab_prefill.sh. Expected ~-0.12 ms.
#   PART=3 (~4 min): the batch-1 step's plan options (`scripts/tune_step.py --groups options`, SHARED_FIRST
#          among them): what wins is in $OUT/options; copy its tables in, then verify_serve.sh.
#   PART=4 (~2 min): scripts/probe_packed_dot_gemv.py as committed (its first form ran on 2026-12-05; this one
#          joins its two copies): `check` on the GPU, then `bench`, to confirm that row of docs/performance.md.
# The 12-bit packed kernels (`--pack-weights`) were timed on 2026-12-05 and are not faster (docs/performance.md):
# `python3 -m hyserve.kernels.linear.bench --packed` and `python3 -m hyserve.kernels.moe.bench --pairs` are the
# first gate for a new version of them. Carry .whl (and .base for PART=2).
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
case "${PART:-1}" in
  1)
    TAILN=12 run check_prefill 300 python3 scripts/check_prefill_graphs.py --model $M --load-format dummy \
      --kv-cache-memory-gb 8 --max-num-seqs 8 --max-model-len 8192 --prompt-lens 100,128,1000,1024,4096 --reps 3
    ;;
  2) LENS=${LENS:-128,1024} REPS=${REPS:-7} bash scripts/device/ab_prefill.sh ;;
  3) NAME=options BATCH=1 KNOBS=options PASSES=1 REPLAYS=200 LIMIT=500 bash scripts/device/tune_step.sh ;;
  4)
    TAILN=5 run probe_check 120 python3 scripts/probe_packed_dot_gemv.py check
    TAILN=40 run probe_bench 240 python3 scripts/probe_packed_dot_gemv.py bench
    ;;
  *) echo "PART must be 1 to 4" && exit 2 ;;
esac
