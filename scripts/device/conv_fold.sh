#!/usr/bin/env bash
# The DeltaNet prefill's conv inside the chunk kernels (`gated_delta_rule_prefill_conv`), on the H200.
# PART=1: its GPU tests and `tests/test_prefill_graphs.py`, then `gated_delta_rule.bench --conv` on src and on the
# trees named in BENCH_TREES (other builds of the kernel, carried). PART=2: the first token without HTTP, before
# (.base/src, carried) against src (`ab_prefill.sh`). PART=all: the bench on src, the conv's tests and one round of
# the first token at 1024 and 4096 tokens with the prefill config's `conv_inside` off (src) and on (.alt/src, a copy
# of src with it on), in one call. Carry .whl (and .base, .alt, the BENCH_TREES).
set -u
source "$(dirname "$0")/common.sh"
if [ "${PART:-1}" = all ]; then
  TAILN=7 run bench 100 python3 -m hyserve.kernels.gated_delta_rule.bench --conv
  TAILN=4 run tests 150 python3 -m pytest -q -x src/hyserve/kernels/gated_delta_rule/test_gated_delta_rule.py -k conv
  SIDES=${SIDES:-off:src on:.alt/src} LENS=${LENS:-1024,4096} REPS=${REPS:-5} ROUNDS=1 KVGB=${KVGB:-4} \
    bash "$(dirname "$0")/ab_prefill.sh"
elif [ "${PART:-1}" = 1 ]; then
  TAILN=6 run tests 240 python3 -m pytest -q -x src/hyserve/kernels/gated_delta_rule/test_gated_delta_rule.py \
    -k "conv or prefill_triton"
  TAILN=4 run graphs 200 python3 -m pytest -q -x tests/test_prefill_graphs.py
  for tree in src ${BENCH_TREES:-}; do
    PYTHONPATH=/tmp/site:$tree TAILN=7 run "bench_${tree//\//_}" 150 python3 -m hyserve.kernels.gated_delta_rule.bench --conv
  done
else
  LENS=${LENS:-128,1024,4096} REPS=${REPS:-5} ROUNDS=${ROUNDS:-2} bash "$(dirname "$0")/ab_prefill.sh"
fi
