#!/usr/bin/env bash
# Follow-up to l2_prefetch.sh on the same (warm) machine: more GEMV prefetch spans on top of the winner
# it left in $W (best.txt, gemv_/moe_<best>.json), B=1 profile each (~2.5 min; carry .whl).
set -u
source "$(dirname "$0")/common.sh"
MOE=src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json
GEMV=src/hyserve/kernels/linear/configs/gemv.json
best=$(cut -d' ' -f1 $W/best.txt)
echo "on top of $best: $(cat $W/best.txt)"
more() { python3 - "$W/gemv_$best.json" "$2" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
for item in filter(None, sys.argv[2].split(",")):
    shape, s = item.split("=")
    g["plans"][shape]["PREFETCH_L2"] = int(s)
json.dump(g, open("src/hyserve/kernels/linear/configs/gemv.json", "w"), indent=1)
PY
  cp "$W/moe_$best.json" $MOE
  TAILN=0 run "more_$1" 100 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
    --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 \
    --steps 30 --no-warmup
  echo "$1 $(grep -h '== batch 1:' "$W/more_$1.log" | sed -E 's/.*step ([0-9.]+) ms.*/\1/')" | tee -a $W/more.txt
  cp $GEMV "$W/gemv_more_$1.json"
}
more same ""
more oproj4 "2048x4096=4"
more inproj2 "12352x2048=2,9216x2048=2"
more lmhead1 "248320x2048=1"
cp $W/gemv_more_*.json $W/more.txt "$OUT/"
