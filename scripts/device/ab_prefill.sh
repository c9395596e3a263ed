#!/usr/bin/env bash
# The first token without HTTP, before against after: scripts/profile_prefill.py on the tree's src and on
# .base/src (the "before" side: `git archive <commit> src | tar -x -C .base`, carried), alternated ROUNDS times.
# Env: LENS (128,1024,4096), REPS (7), TOP (10: kernels listed), ROUNDS (2), KVGB (8: KV cache GiB), SIDES (label:src-folder pairs in the
# order run each round; "before:.base/src after:src", e.g. add "alt:.alt/src" for a third tree, carried too; a third
# field adds engine flags, comma-separated: "mma:src:--mma-experts").
# LAYERS: the model cut to its first LAYERS layer types (`depth_model`, for an H100).
# Carry .base (and .whl for the common environment).
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
[ -n "${LAYERS:-}" ] && M=$(depth_model "$LAYERS")
args=(--model $M --load-format dummy --kv-cache-memory-gb "${KVGB:-8}" --max-num-seqs 8 --max-model-len 8192
  --cuda-graph-sizes 1 --prompt-lens "${LENS:-128,1024,4096}" --reps "${REPS:-7}" --top "${TOP:-10}")
for i in $(seq 1 "${ROUNDS:-2}"); do
  for side in ${SIDES:-before:.base/src after:src}; do
    IFS=: read -r label tree flags <<< "$side"
    PYTHONPATH=/tmp/site:$tree TAILN=5 run "$label$i" 200 python3 scripts/profile_prefill.py "${args[@]}" ${flags//,/ }
  done
done
