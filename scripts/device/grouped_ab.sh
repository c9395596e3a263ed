#!/usr/bin/env bash
# A change to the 12-bit grouped MoE kernels (`moe/mma_grouped_cuda.py`), before against after on one machine:
# `moe.bench`'s grouped rows (gate_up, down + sum, the Triton bf16 plan beside them) on each SIDES tree, alternated
# ROUNDS times; the grouped kernels' GPU tests on src; then, while the call has time left (PREFILL_BY seconds into
# it), the first token without HTTP on each side (`ab_prefill.sh`: LENS, REPS, one round).
# Env: TOKENS (128,512,1024), TILES (the plans' tiles: "(4, 1, 0), (4, 1, 1), (8, 1, 1)"), ROUNDS (2), SIDES
# ("before:.base/src after:src"; a third field, tiles, times those instead, e.g. "w16:src:(16, 1, 1)"),
# PREFILL_BY (300; 0 skips it), PREFILL_SIDES (ab_prefill.sh's SIDES: "before:.base/src after:src"), LENS
# (128,1024), REPS (5). Carry .whl and .base
# (`git archive <commit> src | tar -x -C .base`). Long output under $OUT; the summary last.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
bench() {  # bench TREE TILES: the bench's timing lines on TREE
  local b="import hyserve.kernels.moe.bench as b; b.MMA_GROUPED_TILES = ($2,); b.grouped_mma_times((${TOKENS:-128,512,1024},))"
  PYTHONPATH=/tmp/site:$1 timeout 150 python3 -c "$b" 2>&1 | grep -E "^T=|Error|error"
}
for i in $(seq 1 "${ROUNDS:-2}"); do
  for side in ${SIDES:-before:.base/src after:src}; do
    IFS=: read -r label tree tiles <<< "$side"
    echo "== $label (round $i)" | tee -a $OUT/bench.txt
    bench "$tree" "${tiles:-${TILES:-(4, 1, 0), (4, 1, 1), (8, 1, 1)}}" | tee -a $OUT/bench.txt
  done
done
TAILN=4 run tests 200 python3 -m pytest -q -x src/hyserve/kernels/moe/test_mma_grouped.py
if [ "${PREFILL_BY:-300}" -gt 0 ] && [ $SECONDS -lt "${PREFILL_BY:-300}" ]; then
  SIDES="${PREFILL_SIDES:-before:.base/src after:src}" ROUNDS=1 LENS=${LENS:-128,1024} REPS=${REPS:-5} TOP=6 \
    bash "$(dirname "$0")/ab_prefill.sh"
else
  echo "first token: skipped at ${SECONDS} s"
fi
echo "== summary"
cat $OUT/bench.txt
