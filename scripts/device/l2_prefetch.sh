#!/usr/bin/env bash
# The bulk L2 prefetch (kernels/l2_prefetch.py) on the H200, one call (~8 min; carry .whl):
# 1. the GPU tests of the option (GEMV, pairs MoE, graph replays);
# 2. the B=1 decode profile with the committed plans, then with PREFETCH_L2 switched on in gemv.json /
#    the MoE T=1 bucket (edited on the device: the variants below);
# 3. the HTTP table and the full-size verify with the fastest variant's plans (its JSONs come back in $OUT).
set -u
source "$(dirname "$0")/common.sh"
MOE=src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json
GEMV=src/hyserve/kernels/linear/configs/gemv.json
run pytest 120 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/linear \
  src/hyserve/kernels/moe/test_moe.py -k "gemv or pairs_kernel_options or cuda_graph"
grep -E "^FAILED|^E " $W/pytest.log | head -n 12
cp $MOE $W/moe.json; cp $GEMV $W/gemv.json
# variant NAME GEMV_SHAPES(S per shape, "shape=S,...") MOE_T1 (0, 1: gate_up and down, gu, dn)
variant() { python3 - "$2" "$3" <<'PY'
import json, sys
g = json.load(open("/tmp/w/gemv.json")); m = json.load(open("/tmp/w/moe.json"))
for item in filter(None, sys.argv[1].split(",")):
    shape, s = item.split("=")
    g["plans"][shape]["PREFETCH_L2"] = int(s)
for part in {"1": ("gate_up", "down"), "gu": ("gate_up",), "dn": ("down",)}.get(sys.argv[2], ()):
    m["buckets"]["1"][part]["PREFETCH_L2"] = 1
json.dump(g, open("src/hyserve/kernels/linear/configs/gemv.json", "w"), indent=1)
json.dump(m, open("src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json", "w"), indent=1)
PY
  TAILN=0 run "profile_$1" 100 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
    --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 \
    --steps 30 --no-warmup
  local ms; ms=$(grep -h "== batch 1:" "$W/profile_$1.log" | sed -E 's/.*step ([0-9.]+) ms.*/\1/')
  echo "$1 ${ms:-fail}" | tee -a $W/variants.txt
  [ -n "$ms" ] && cp $GEMV "$W/gemv_$1.json" && cp $MOE "$W/moe_$1.json"
}
variant base "" 0
variant oproj1 "2048x4096=1" 0
variant oproj2 "2048x4096=2" 0
variant moe "" 1
variant moe_gu "" gu
variant moe_dn "" dn
variant oproj2_moe "2048x4096=2" 1
variant all2_moe "2048x4096=2,12352x2048=1,9216x2048=1" 1
variant base_again "" 0
sort -k2 -n $W/variants.txt | grep -v fail | head -n 1 | tee $W/best.txt
best=$(cut -d' ' -f1 $W/best.txt)
cp "$W/gemv_$best.json" $GEMV; cp "$W/moe_$best.json" $MOE; cp $GEMV $MOE "$OUT/"
sed -n '/== batch 1:/,/^$/p' "$W/profile_$best.log" | head -n 14
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
  | grep -E "^(decode|ttft|throughput) |ready after"
TAILN=9 run verify $((590 - SECONDS)) python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
tar czf "$OUT/results.tgz" -C $W .
