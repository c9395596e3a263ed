#!/usr/bin/env bash
# Prepared for the next session (three calls, carry .whl; each ~4-9 min):
#   PART=1: the accuracy gate and the HTTP table with d229229's step-tuned plans (never run with them):
#           `hyserve verify --paths fast` at full size, then serve_bench.sh (scripts/device/verify_serve.sh).
#   PART=2: the batch-1 step tuner over every group, the options and the screen included, two passes
#           (tables it keeps in $OUT/tuned_b1).
#   PART=3: the tuner at batch 2 and 4 (MoE bucket, DeltaNet entry, screen plan, GEMV max_rows, options;
#           $OUT/tuned_b2, $OUT/tuned_b4). Copy what is kept into the tree, then PART=1 again before committing.
set -u
dir=$(dirname "$0")
export REPLAYS=200 TAILN=60
case "${PART:-1}" in
  1) bash "$dir/verify_serve.sh" ;;
  2) NAME=tuned_b1 BATCH=1 KNOBS=gemv,moe,gdn,attention,screen,options PASSES=2 bash "$dir/tune_step.sh" ;;
  3) for b in 2 4; do
       NAME=tuned_b$b BATCH=$b KNOBS=gemv,moe,gdn,screen,options LIMIT=270 bash "$dir/tune_step.sh"
     done ;;
esac
