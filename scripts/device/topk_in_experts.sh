#!/usr/bin/env bash
# The MoE top-k taken in the expert kernels (plan "topk_in_experts", 2026-12-03) on the H200, one call
# (~8 min; carry .whl): the GPU tests of the change (pairs paths, bit-identity with the router's routing,
# graph replays against plain launches), then the B=1 decode profile with the committed plans and with
# topk_in_experts on in the T=1 (and T=1,2,4) MoE buckets (edited on the device), then the HTTP table and the
# full-size verify with the faster of them (its JSON comes back in $OUT).
set -u
source "$(dirname "$0")/common.sh"
MOE=src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json
run pytest 150 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_moe.py \
  -k "pairs or topk_in_experts or cuda_graph or fused_router"
grep -E "^FAILED|^E " $W/pytest.log | head -n 12
cp $MOE $W/moe.json
variant() {
  python3 -c "import json, sys; d = json.load(open('$W/moe.json'))
for t in sys.argv[1:]: d['buckets'][t]['topk_in_experts'] = True
json.dump(d, open('$MOE', 'w'), indent=1)" $2
  TAILN=0 run "profile_$1" 100 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
    --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,4 --prefill-graph-sizes none --batch 1,4 \
    --steps 30 --no-warmup
  local ms; ms=$(grep -h "== batch 1:" "$W/profile_$1.log" | sed -E 's/.*step ([0-9.]+) ms.*/\1/')
  echo "$1 ${ms:-fail} $(grep -h '== batch 4:' "$W/profile_$1.log" | sed -E 's/.*step ([0-9.]+) ms.*/B=4 \1/')" \
    | tee -a $W/variants.txt
  [ -n "$ms" ] && cp $MOE "$W/moe_$1.json"
}
variant base ""
variant topk1 "1"
variant topk124 "1 2 4"
variant base_again ""
sort -k2 -n $W/variants.txt | grep -v fail | head -n 1 | tee $W/best.txt
best=$(cut -d' ' -f1 $W/best.txt)
cp "$W/moe_$best.json" $MOE; cp $MOE "$OUT/"
sed -n '/== batch 1:/,/^$/p' "$W/profile_$best.log" | head -n 12
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
  | grep -E "^(decode|ttft|throughput) |ready after"
TAILN=9 run verify $((590 - SECONDS)) python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
tar czf "$OUT/results.tgz" -C $W .
