#!/usr/bin/env bash
# PDL with loads before the wait (the GEMV, router and MoE-down weights, the DeltaNet state: kernels/pdl.py)
# on the H200, in one call: the GPU tests of those kernels (graph replays included), the decode-step profile
# (B=1, 32), the HTTP table (serve_bench.sh) and the full-size verify. Results: $OUT/results.tgz, verify.json.
set -u
source "$(dirname "$0")/common.sh"
run pytest_pdl 150 python3 -m pytest -q -x -p no:cacheprovider src/hyserve/kernels/test_pdl.py \
  src/hyserve/kernels/moe/test_moe.py src/hyserve/kernels/linear src/hyserve/kernels/gdn_decode_step \
  -k "dependent or switch or cuda or (gemv and not bench) or triton_matches or many_steps"
grep -E "^FAILED|^E " $W/pytest_pdl.log | head -n 12
TAILN=0 run profile 120 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --prefill-graph-sizes none --batch 1,32 \
  --steps 30 --no-warmup
grep -h "== batch" $W/profile.log
sed -n '/== batch 1:/,/^$/p' $W/profile.log | head -n 12
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95
left=$((590 - SECONDS)); echo "verify gets ${left} s"
TAILN=9 run verify $left python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
tar czf "$OUT/results.tgz" -C $W .
