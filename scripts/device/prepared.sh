#!/usr/bin/env bash
# The numbers of record at HEAD on the H200 in one call (carry .whl): the HTTP table (serve_bench.sh), the
# full-size verify of the fast path, the B=1 / B=32 decode profile, then one A/B: the B=1 profile with the paged
# decode split kernel as it was before de23da1 (first K/V tile loaded after the PDL wait), made here with
# `git revert --no-commit de23da1` and carried as scripts/device/ab/triton_decode.py (untracked).
set -u
source "$(dirname "$0")/common.sh"
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95
cp $W/bench_*.log $W/server.log "$OUT/" 2> /dev/null
TAILN=9 run verify 200 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
profile() {
  TAILN=0 run "profile_$1" 100 python3 scripts/profile_decode.py --model $M --load-format dummy \
    --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes "$2" \
    --prefill-graph-sizes none --batch "$2" --steps 30 --no-warmup
  cp "$W/profile_$1.log" "$OUT/"
  grep -h "== batch" "$W/profile_$1.log"
}
profile head 1,32
sed -n '/== batch 1:/,/^$/p' "$W/profile_head.log" | head -n 16
if [ -f scripts/device/ab/triton_decode.py ]; then
  cp scripts/device/ab/triton_decode.py src/hyserve/kernels/attention/triton_decode.py
  profile attn_before_de23da1 1
  grep -h "_paged_decode" "$W/profile_attn_before_de23da1.log" | head -n 4
fi
