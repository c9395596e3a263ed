#!/usr/bin/env bash
# The measurements still owed, in one call on whichever card comes (carry .whl):
#   H200 (>= 100 GB; the HTTP table and verify with --mma-experts were taken at ff60887): the whole start-up line and
#     a second decode sample with --mma-experts; the first token without HTTP at 512 / 1024 tokens, bf16 experts
#     against their 12-bit copies (at 1024 the copies' TTFT was ~1 ms worse through HTTP: where should the grouped
#     12-bit kernels stop on this card?); the batch-1 step by op with the copies (ab_decode.sh's profile, whose
#     log $OUT/mma.log has the per-op table); the 12-bit gate_up's anatomy (src against esclast, the dependencies taken
#     out one at a time), ~9 min; first, each grouped kernel alone at 128 / 512 / 1024 tokens, bf16 against the copies
#     (which of gate_up and down should a bucket's "mma_grouped" keep on bf16?);
#   H100: the 12-bit gate_up's GPU tests (passed on the H200 at ff60887), then gate_up_anatomy.sh, ~5 min.
set -u
source "$(dirname "$0")/common.sh"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
if [ "$mem" -gt 100000 ]; then
  TAILN=40 run grouped 150 python3 -m hyserve.kernels.moe.bench --mma-grouped --tokens 128,512,1024
  DECODE_ONLY=1 bash "$(dirname "$0")/serve_bench.sh" --max-num-seqs 48 --max-model-len 8192 \
    --gpu-memory-utilization 0.95 --mma-experts 2>&1 | grep -v "^hyserve:" | tail -n 12
  SIDES="bf16:src:--no-mma-experts-only mma:src:--mma-experts" ROUNDS=1 REPS=5 TOP=6 KVGB=4 LENS=512,1024 \
    bash "$(dirname "$0")/ab_prefill.sh" 2>&1 | tail -n 40
  TESTS=none KVGB=4 SEQS=8 SIDES="mma:src:--mma-experts" TOP=14 bash "$(dirname "$0")/ab_decode.sh" 2>&1 | tail -n 5
  NCU=0 TREES="src .v/esclast/src .v/noids/src .v/nonorm/src .v/nomma/src .v/bare/src" \
    bash "$(dirname "$0")/gate_up_anatomy.sh" 2>&1 | tail -n 30
  exit
fi
timeout 120 python3 -m pytest -p no:cacheprovider -rfE src/hyserve/kernels/moe/test_mma_pairs.py -k gate_up \
  > "$OUT/t_pairs.log" 2>&1
echo "gate_up tests rc=$? $(grep -E '(passed|failed|error)' "$OUT/t_pairs.log" | tail -n 1)"
grep -E "^(FAILED|ERROR)" "$OUT/t_pairs.log" | head -n 5
bash "$(dirname "$0")/gate_up_anatomy.sh" 2>&1 | tail -n 60
