#!/usr/bin/env bash
# The H200 record under the default and what goes with it (its H200 part ran on 2026-12-07, 31e7320: performance.md),
# in one call of at most ~9.5 min, on whichever card comes (carry .whl):
#   H200 (>= 100 GB): the default's (the experts' 12-bit copies alone) HTTP table and full-size verify
#     (verify_serve.sh, ~6-7 min cold); then, while time is left, the batch-1 step by op under the default
#     (ab_decode.sh's profile, for "One decode step at batch 1, by op"), the first token without HTTP at 128 / 1024
#     tokens, bf16 experts against the copies (where does the default lose on this card?), and the grouped kernels'
#     GPU tests, then each alone at 128 / 512 / 1024 tokens, bf16 against the copies; then their L2 lookahead
#     (`mma_grouped.L2_AHEAD`) as committed against 0 and 2 chunks (grouped_anatomy.sh).
#   H100: the grouped 12-bit kernels' GPU tests, then every grouped variant alone at 512 / 1024 / 4096 tokens.
# Each later part runs only when the seconds it needs are left of BUDGET (560).
set -u
source "$(dirname "$0")/common.sh"
D=$(dirname "$0")
W=$OUT
grouped() {  # grouped TOKENS: test_mma_grouped.py, then `bench --mma-grouped` (bf16 Triton against each 12-bit variant)
  TAILN=2 run t_grouped 240 python3 -m pytest -q -p no:cacheprovider -rfE src/hyserve/kernels/moe/test_mma_grouped.py
  grep -E "^(FAILED|ERROR)" "$W/t_grouped.log" | head -n 8
  TAILN=100 run grouped 240 python3 -m hyserve.kernels.moe.bench --mma-grouped --tokens "$1"
}
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
left() { [ $((${BUDGET:-560} - SECONDS)) -ge "$1" ] || { echo "== skipped (needs $1 s, $((${BUDGET:-560} - SECONDS)) left): $2"; false; }; }
if [ "$mem" -gt 100000 ]; then
  bash "$D/verify_serve.sh"
  left 100 "the batch-1 step by op" \
    && TESTS=none KVGB=4 SEQS=8 SIDES="copies:src:" TOP=16 bash "$D/ab_decode.sh" 2>&1 | tail -n 22
  left 150 "first token, bf16 against the copies" \
    && SIDES="bf16:src:--no-mma-experts-only copies:src:" ROUNDS=1 REPS=5 TOP=6 KVGB=4 LENS=128,1024 \
      bash "$D/ab_prefill.sh" 2>&1 | tail -n 24
  left 150 "the grouped kernels' tests and each alone" && grouped 128,512,1024
  left 90 "the grouped kernels' L2 lookahead, 0 and 2 chunks (grouped's rows above: 1)" \
    && TREES= AHEADS="0 2" bash "$D/grouped_anatomy.sh"
  exit 0
fi
grouped 512,1024,4096
