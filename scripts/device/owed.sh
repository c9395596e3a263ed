#!/usr/bin/env bash
# The measurements still owed, in one call of at most ~9.5 min, on whichever card comes (carry .whl): the grouped
# wgmma kernels' late wait (`mma_grouped.LATE_WAIT`: a chunk's wgmma waited for in the next chunk's step, after its
# barrier; four x buffers; ptxas gives it ~190 registers against 128, so one 8-warp CTA an SM instead of two).
#   1. test_mma_grouped.py (the late wait against the reference's bits: test_l2_lookahead_and_late_wait_move_no_bits);
#   2. each kernel alone at 512 / 1024 tokens, as committed and with the late wait (grouped_anatomy.sh, LATE=1);
#   3. on an H200 while time is left: the first token without HTTP at 1024 tokens, the late wait against without
#      (ab_prefill.sh; the whole model under the default, the experts' 12-bit copies alone).
# Each later part runs only when the seconds it needs are left of BUDGET (560).
set -u
source "$(dirname "$0")/common.sh"
D=$(dirname "$0")
W=$OUT
left() { [ $((${BUDGET:-560} - SECONDS)) -ge "$1" ] || { echo "== skipped (needs $1 s, $((${BUDGET:-560} - SECONDS)) left): $2"; false; }; }
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
TAILN=2 run t_grouped 240 python3 -m pytest -q -p no:cacheprovider -rfE src/hyserve/kernels/moe/test_mma_grouped.py
grep -E "^(FAILED|ERROR)" "$W/t_grouped.log" | head -n 8
left 90 "each kernel alone, with and without the late wait" \
  && TREES=src AHEADS= LATE=1 TOKENS=512,1024 bash "$D/grouped_anatomy.sh"
if [ "$mem" -gt 100000 ] && left 150 "the first token at 1024 tokens, the late wait against without"; then
  rm -rf .late && mkdir .late && cp -r src .late/src
  sed -i 's/^LATE_WAIT = False$/LATE_WAIT = True/' .late/src/hyserve/kernels/moe/mma_grouped.py
  grep -q "^LATE_WAIT = True$" .late/src/hyserve/kernels/moe/mma_grouped.py || echo "== the .late tree's edit failed"
  SIDES="late:.late/src: now:src:" ROUNDS=2 REPS=5 TOP=4 KVGB=4 LENS=1024 bash "$D/ab_prefill.sh" 2>&1 | tail -n 16
  rm -rf .late
fi
