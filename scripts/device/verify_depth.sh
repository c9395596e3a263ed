#!/usr/bin/env bash
# `hyserve verify` on Qwen3.6-35B-A3B's full widths at a smaller depth: the first LAYERS (default 16) of its
# 40 layer types, dummy weights. Every kernel runs at its production shape, so the fast path's accuracy gate
# runs where the whole model plus verify's fp32 truth does not fit (an H100). Once with the engine's defaults
# (+ FLAGS), once with CMP_FLAGS (default --no-mma-projections) for comparison. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
L=${LAYERS:-16}
D=$(depth_model $L)
V="python3 -m hyserve verify --model $D --load-format dummy --kv-cache-memory-gb 4 --max-num-seqs 8
  --max-model-len 4096 --paths fast"
TAILN=8 run verify_default 280 $V ${FLAGS:-}
TAILN=8 run verify_cmp 280 $V ${CMP_FLAGS:---no-mma-projections}
