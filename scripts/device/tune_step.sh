#!/usr/bin/env bash
# A small decode batch's tile plans tuned on its own step (~1 s a variant, ~60 variants a pass, plus ~2 min of
# start from a cold machine). Env: BATCH (1), KNOBS (the groups, e.g. gemv,moe,gdn,attention,screen,options),
# PASSES (1), REPLAYS (300), LIMIT (540 s), KVGB (KV cache GB: 8; 3 fits an H100), SHAPES (the GEMV shapes tuned,
# comma-separated; all), NAME (the run's log and its tables' folder under $OUT: tuned), EXTRA (more engine flags,
# e.g. --mma-experts).
# scripts/tune_step.py keeps what wins in the step; before committing its tables: copy them in, then
# `hyserve verify` and the HTTP table (scripts/device/verify_serve.sh) in the next call.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
name=${NAME:-tuned}
TAILN=${TAILN:-80} run "$name" "${LIMIT:-540}" python3 scripts/tune_step.py --model $M --load-format dummy \
  --kv-cache-memory-gb ${KVGB:-8} --max-num-seqs 8 --max-model-len 8192 --groups "${KNOBS:-gemv,moe,gdn,attention}" \
  --replays "${REPLAYS:-300}" --passes "${PASSES:-1}" --batch "${BATCH:-1}" ${SHAPES:+--shapes "$SHAPES"} --out "$OUT/$name" ${EXTRA:-}
