#!/usr/bin/env bash
# The L2 prefetch option (kernels/l2_prefetch.py) on the H200 (~7 min from a cold machine; carry .whl): its GPU
# tests (the GEMV's and the pairs gate_up's results with and without it), then the step tuner over the "l2pf"
# group at batch 1 (the GEMV shapes, the gate_up's shared-expert prefetch, the attention's fused reduce) and
# at batch 2 and 4 (the gate_up), each from today's tables. Tables kept: $OUT/l2pf_b1, _b2, _b4.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=4 run tests 150 python3 -m pytest -q -x src/hyserve/kernels/linear/test_linear.py \
  src/hyserve/kernels/moe/test_moe.py::test_pairs_kernel_options -k "l2 or L2PF or options"
for b in 1 2 4; do
  TAILN=${TAILN_TUNE:-40} NAME=l2pf_b$b BATCH=$b KNOBS=l2pf PASSES=1 REPLAYS=200 LIMIT=240 \
    bash "$(dirname "$0")/tune_step.sh"
done
