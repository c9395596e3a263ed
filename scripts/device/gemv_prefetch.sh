#!/usr/bin/env bash
# The GEMV's PREFETCH option in the batch-1 step (~5 min from a cold machine): GPU tests of the GEMV, then
# `profile_decode.py` with the committed plans, with PREFETCH on the 2048x4096 plan (out_proj, o_proj: four
# K tiles a program, one in flight at a time without it), and on every plan; the GEMV rows are split by the
# kernel before them (in_proj after the MoE down, out_proj after the DeltaNet step, qkv after the MoE down of
# an attention layer's predecessor, o_proj after the attention). Then `hyserve verify` (fast path). Logs in $OUT.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=3 run tests 150 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/linear
args="--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 8192 --prompt-len 384
  --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup --top 24"
J=src/hyserve/kernels/linear/configs/gemv.json
cp $J /tmp/gemv.json
set_prefetch() {  # shapes... : PREFETCH on those plans, from the committed file
  python3 - "$@" <<'PY'
import json, sys
p = "src/hyserve/kernels/linear/configs/gemv.json"
d = json.load(open("/tmp/gemv.json"))
for s in sys.argv[1:]:
    d["plans"][s]["PREFETCH"] = 1
json.dump(d, open(p, "w"), indent=1)
PY
}
TAILN=4 run prof_base 150 python3 scripts/profile_decode.py $args
set_prefetch 2048x4096
TAILN=4 run prof_pf_out 150 python3 scripts/profile_decode.py $args
set_prefetch 2048x4096 12352x2048 9216x2048
TAILN=4 run prof_pf_all 150 python3 scripts/profile_decode.py $args
cp /tmp/gemv.json $J
for v in base pf_out pf_all; do
  echo "== $v"; grep -E "gemv|== batch|_step|router|gate_up|down" "$W/prof_$v.log" | head -n 14
done
TAILN=8 run verify 200 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast
