#!/usr/bin/env bash
# The grouped MoE kernels over the experts' 12-bit copies (moe/mma_grouped.py) in one device call: their GPU
# tests (stops here on a failure), the kernel benchmark against the Triton plans at TOKENS, then the first token
# without HTTP with and without --mma-experts (ab_prefill.sh; LAYERS (16) of the model's layers so that the model
# and its copies fit an H100; 0 = the whole model). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
TAILN=12 run tests 200 python3 -m pytest -q -x -p no:cacheprovider src/hyserve/kernels/moe/test_mma_grouped.py
grep -q " passed" $W/tests.log && ! grep -q -E "failed|error" $W/tests.log || exit 1
TAILN=40 run bench 200 python3 -m hyserve.kernels.moe.bench --mma-grouped --tokens "${TOKENS:-64,256,1024,2048,4096}"
L=${LAYERS:-16}
[ "$L" = 0 ] && L=
LAYERS=$L SIDES="bf16:src mma:src:--mma-experts" ROUNDS=1 REPS=${REPS:-5} TOP=${TOP:-6} KVGB=${KVGB:-4} \
  LENS=${LENS:-128,1024,4096} bash scripts/device/ab_prefill.sh
