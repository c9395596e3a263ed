#!/usr/bin/env bash
# The grouped MoE kernels over the experts' 12-bit copies (moe/mma_grouped.py) in one device call: their GPU
# tests (stops here on a failure), the kernel benchmark against the Triton plans at TOKENS; then, on the model cut
# to LAYERS (16) layers so that it and its copies fit an H100, with and without --mma-experts: the first token
# without HTTP (ab_prefill.sh at LENS), the decode step at BATCH (32; ab_decode.sh), and `hyserve verify` with
# --mma-experts. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
TAILN=4 run tests 200 python3 -m pytest -q -x -p no:cacheprovider src/hyserve/kernels/moe/test_mma_grouped.py
grep -q -E "^(FAILED|ERROR)|[0-9]+ failed" $W/tests.log && exit 1
TAILN=60 run bench 200 python3 -m hyserve.kernels.moe.bench --mma-grouped --tokens "${TOKENS:-32,128,512,1024}"
L=${LAYERS:-16}
LAYERS=$L SIDES="bf16:src:--no-mma-experts-only mma:src:--mma-experts" ROUNDS=1 REPS=${REPS:-5} TOP=${TOP:-6} KVGB=${KVGB:-4} \
  LENS=${LENS:-128,512,1024} bash scripts/device/ab_prefill.sh
LAYERS=$L SIDES="bf16:src:--no-mma-experts-only mma:src:--mma-experts" TESTS=none BATCH=${BATCH:-32} SEQS=32 KVGB=${KVGB:-4} TOP=${TOP:-6} \
  bash scripts/device/ab_decode.sh
D=$(depth_model $L)
TAILN=8 run verify_mma 280 python3 -m hyserve verify --model $D --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --mma-experts
