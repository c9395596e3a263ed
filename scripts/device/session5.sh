#!/usr/bin/env bash
# One-off (2026-12-03, third session): the T = 1 router with its top-k on sub-rows a warp (`_row_softmax_topk`) and
# its GEMV on 2-D tiles against both as before (a [1, E] top-k tile, a [1, BE, BK] product), in the B = 1 decode
# step (the server's shapes); then with the experts' own top-k; then the GPU routing tests. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
PROF="python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 \
  --max-model-len 8192 --prompt-len 384 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup"
TAILN=25 run decode_new 120 $PROF
F=src/hyserve/kernels/moe/routing.py
cp $F /tmp/new_routing.py
sed -i 's/        if TP == 1 and not GROUP:  # top-k of one token/        if False:  # top-k of one token/; s/    elif xt.shape\[0\] == 1:  # one token/    elif False:  # one token/' $F
grep -c "if False:  # \(top-k of\|one token\)" $F
TAILN=25 run decode_old 120 $PROF
cp /tmp/new_routing.py $F
TAILN=4 run tests 90 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_moe.py -k "pairs or topk or routing"
# the expert kernels' own top-k (plan option topk_in_experts, off: it lost 150-190 us at 1af28d8 when its top-k
# took 36 CTA barriers in the gate_up kernel; 14 now), on in the T = 1 bucket on the device only
python3 - <<'PY'
import json
path = "src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json"
cfg = json.load(open(path))
cfg["buckets"]["1"]["topk_in_experts"] = True
json.dump(cfg, open(path, "w"), indent=1)
PY
TAILN=25 run decode_topk_in_experts 120 $PROF
