#!/usr/bin/env bash
# The batch-1 decode step, before against after: GPU tests of the changed kernels (TESTS; none: no tests), then
# scripts/profile_decode.py on the tree's src and on .base/src (the "before" side: `git archive <commit> src |
# tar -x -C .base`, carried), each once. SIDES (default "after:src before:.base/src") names other label:src-folder
# pairs, a third field adding engine flags, comma-separated ("mma:src:--mma-experts"). KVGB (8), SEQS (32): the
# KV cache GiB and --max-num-seqs. BATCH (1): the decode batch profiled (its graph captured). LAYERS: the model cut to
# its first LAYERS layer types (`depth_model`, for an H100).
# Carry .base (and .whl for the common environment).
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
[ -n "${LAYERS:-}" ] && M=$(depth_model "$LAYERS")
if [ "${TESTS:-}" != none ]; then
  TAILN=3 run tests "${TEST_LIMIT:-120}" python3 -m pytest -q -p no:cacheprovider -x ${TESTS:-tests/test_decode_staging.py}
fi
args=(--model $M --load-format dummy --kv-cache-memory-gb "${KVGB:-8}" --max-num-seqs "${SEQS:-32}" --max-model-len 8192 --prompt-len 384
  --cuda-graph-sizes "${BATCH:-1}" --prefill-graph-sizes none --batch "${BATCH:-1}" --steps 30 --no-warmup --top "${TOP:-12}")
for side in ${SIDES:-after:src before:.base/src}; do
  IFS=: read -r label tree flags <<< "$side"
  PYTHONPATH=/tmp/site:$tree TAILN=2 run "$label" 150 python3 scripts/profile_decode.py "${args[@]}" ${flags//,/ }
done
