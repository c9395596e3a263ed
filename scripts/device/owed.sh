#!/usr/bin/env bash
# What the H200 owes after the 45th session (2026-12-08, no device lent), one call a PART (each <= ~9.5 min), from a
# main checkout with .whl (httptools included: README "On the H200") and .br carried; prepare .br with
#   for b in keep-bf16-experts grouped-prologue grouped-rt grouped-persistent grouped-fused; do
#     rm -rf .br/$b; mkdir -p .br/$b; git archive $b src tests configs | tar -x -C .br/$b; done
#   PART=1: the keep-bf16-experts branch's default (the bf16 experts kept beside their copies where the cache fits,
#     the down at 1024 tokens on them): verify_serve.sh on its tree (the HTTP table, then full-size verify, ~8 min);
#     its server log must say "keeping the experts' bf16 weights".
#   PART=2: the branch's GPU tests (the mma_down plan, the default), then main's default (the copies alone) on the
#     same machine: serve_bench.sh (the table with httptools, the A/B for PART=1), then, if the call is under 300 s
#     in, the first token without HTTP, main's copies alone against the branch's kept experts.
#   PART=3: branches.sh (the grouped-kernel branches against main; the fused kernel).
# The prior owed list (the default's H200 record) ran on 2026-12-07, 31e7320 (performance.md).
set -u
D=$(dirname "$0")
K=.br/keep-bf16-experts/src
case "${PART:-1}" in
  1)
    SRC=$K bash "$D/verify_serve.sh"
    grep -h -m 1 -E "the experts' bf16 weights beside" "${OUT:-/tmp/out}/server.log"
    ;;
  2)
    source "$D/common.sh"
    G=$K/hyserve/kernels/moe/test_mma_grouped.py
    TAILN=2 run keep_tests 300 env PYTHONPATH=/tmp/site:$K python3 -m pytest -q -p no:cacheprovider -rfE \
      $G::test_a_plan_can_take_the_down_back_to_the_bf16_weights $G::test_a_plan_can_keep_the_bf16_weights \
      $K/../tests/test_mma_experts_only.py $K/../tests/test_memory.py
    bash "$D/serve_bench.sh" --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 2>&1 \
      | grep -v "^hyserve:" | tail -n 40
    if [ $SECONDS -lt 300 ]; then
      SIDES="copies:src:--mma-experts-only keep:$K:" ROUNDS=1 REPS=5 TOP=6 KVGB=4 LENS=128,1024,4096 \
        bash "$D/ab_prefill.sh" 2>&1 | tail -n 30
    else
      echo "first token A/B: skipped at $SECONDS s"
    fi
    ;;
  3) bash "$D/branches.sh" ;;
  *) echo "PART must be 1, 2 or 3" && exit 2 ;;
esac
