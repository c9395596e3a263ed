#!/usr/bin/env bash
# Programmatic dependent launch (kernels/pdl.py) on the H200: the decode-step profile (B=1, 32) with PDL and
# with HYSERVE_PDL=0, the full-size verify with it, then the GPU tests of the kernels that take USE_PDL
# (eager launches, real shapes). Results: $OUT/results.tgz, verify.json.
set -u
source "$(dirname "$0")/common.sh"
PROFILE="python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32
  --max-model-len 4096 --cuda-graph-sizes 1,32 --prefill-graph-sizes none --batch 1,32 --steps 30 --no-warmup"
TAILN=0 run profile_pdl 200 $PROFILE
TAILN=0 HYSERVE_PDL=0 run profile_nopdl 160 $PROFILE
grep -h "== batch" $W/profile_pdl.log $W/profile_nopdl.log
sed -n '/== batch 1:/,/^$/p' $W/profile_pdl.log | head -n 14
TAILN=14 run verify 240 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
left=$((570 - SECONDS)); echo "pytest gets ${left} s"
TAILN=0 run pytest_pdl $left python3 -m pytest -q -x -p no:cacheprovider src/hyserve/kernels/test_pdl.py src/hyserve/kernels/rmsnorm \
  src/hyserve/kernels/linear src/hyserve/kernels/gdn_decode_step src/hyserve/kernels/qk_norm_rope \
  src/hyserve/kernels/attention src/hyserve/kernels/moe -k "not tune"
grep -E "passed|failed|^FAILED|^E " $W/pytest_pdl.log | head -n 12
tar czf "$OUT/results.tgz" -C $W .
