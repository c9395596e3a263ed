#!/usr/bin/env bash
# The measurements this commit owes, in one call on whichever card comes (carry .whl):
#   H200 (>= 100 GB): `FLAGS=--mma-experts verify_serve.sh`, the issue-4 table and verify on the experts' 12-bit
#     copies (~118 GB; not yet measured on an H200), ~8 min;
#   H100: the 12-bit gate_up's GPU tests (734a43d moved its first escapes, not yet run on a GPU), then
#     gate_up_anatomy.sh (src against esclast, the dependencies taken out one at a time, ncu stalls), ~5 min.
set -u
source "$(dirname "$0")/common.sh"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
if [ "$mem" -gt 100000 ]; then
  FLAGS=--mma-experts bash "$(dirname "$0")/verify_serve.sh" 2>&1 | tail -n 70
  exit
fi
timeout 120 python3 -m pytest -p no:cacheprovider -rfE src/hyserve/kernels/moe/test_mma_pairs.py -k gate_up \
  > "$OUT/t_pairs.log" 2>&1
echo "gate_up tests rc=$? $(grep -E '(passed|failed|error)' "$OUT/t_pairs.log" | tail -n 1)"
grep -E "^(FAILED|ERROR)" "$OUT/t_pairs.log" | head -n 5
bash "$(dirname "$0")/gate_up_anatomy.sh" 2>&1 | tail -n 60
