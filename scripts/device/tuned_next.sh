#!/usr/bin/env bash
# Prepared for the next session (three calls, carry .whl; each ~4-9 min):
#   PART=1: the accuracy gate and the HTTP table with d229229's step-tuned plans (never run with them):
#           `hyserve verify --paths fast` at full size, then serve_bench.sh (scripts/device/verify_serve.sh).
#   PART=2: the batch-1 step tuner over every group, the options and the screen included, two passes
#           (tables it keeps in $OUT/tuned_b1).
#   PART=3: the tuner at batch 2 and 4 (MoE bucket, DeltaNet entry, screen plan, GEMV max_rows, options;
#           $OUT/tuned_b2, $OUT/tuned_b4). Copy what is kept into the tree, then PART=1 again before committing.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
tune() {  # NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  TAILN=60 run "$name" "$limit" python3 scripts/tune_step.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
    --max-num-seqs 8 --max-model-len 8192 --replays 200 --out "$OUT/$name" "$@"
}
case "${PART:-1}" in
  1) bash scripts/device/verify_serve.sh ;;
  2) tune tuned_b1 540 --batch 1 --groups gemv,moe,gdn,attention,screen,options --passes 2 ;;
  3) tune tuned_b2 270 --batch 2 --groups gemv,moe,gdn,screen,options
     tune tuned_b4 270 --batch 4 --groups gemv,moe,gdn,screen,options ;;
esac
