#!/usr/bin/env bash
# A small decode batch's tile plans (BATCH, default 1) tuned on its step itself (~1 s a variant, ~60 variants a pass plus ~2 min of
# start from a cold machine; KNOBS picks the groups, e.g. KNOBS=gemv,moe,gdn,attention,options PASSES=2):
# scripts/tune_step.py over the GEMV, MoE one-token, DeltaNet-step and decode-attention knobs; the tables it
# keeps land in $OUT/tuned for review. Before committing them: copy them in, `hyserve verify` and the HTTP
# table (scripts/device/verify_serve.sh) in the next call.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=${TAILN:-80} run tune "${LIMIT:-540}" python3 scripts/tune_step.py --model $M --load-format dummy \
  --kv-cache-memory-gb 8 --max-num-seqs 8 --max-model-len 8192 --groups "${KNOBS:-gemv,moe,gdn,attention}" \
  --replays "${REPLAYS:-300}" --passes "${PASSES:-1}" --batch "${BATCH:-1}" --out "$OUT/tuned"
