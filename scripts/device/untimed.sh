#!/usr/bin/env bash
# The changes of 2026-12-03 (third session) prepared on the CPU and not yet timed on the H200, in the B = 1 decode
# step at the server's shapes: the MoE pairs down with h loaded in the weight tile's layout (against the
# broadcast of before, restored by `sed` on the device), the GEMV's BCAST_X option on for every GEMV plan
# (gemv.json edited on the device), and the DeltaNet decode step's sweep with one- and two-warp programs. Then
# the GPU tests of the three kernels. Carry .whl. Keep what wins; write the rows into docs/performance.md.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
PROF="python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 \
  --max-model-len 8192 --prompt-len 384 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup"
TAILN=14 run decode_as_committed 120 $PROF
F=src/hyserve/kernels/moe/triton_pairs.py
cp $F /tmp/pairs_new.py
python3 - <<'PY'
p = "src/hyserve/kernels/moe/triton_pairs.py"
s = open(p).read()
start = s.index("    # h loaded straight into the weight tile's layout")
end = s.index("    return acc, acc_s", start)
old = """    hv = tl.load(h_rows + i[None, :], mask=jm[:, None] & im[None, :], other=0.0)
    if REDUCE_EACH:
        acc += tl.sum(w.to(tl.float32) * hv.to(tl.float32)[:, None, :], axis=2)
    else:
        acc += w.to(tl.float32) * hv.to(tl.float32)[:, None, :]
    if HAS_SHARED:
        hsv = tl.load(hs_row + i, mask=im, other=0.0)
        if REDUCE_EACH:
            acc_s += tl.sum(ws.to(tl.float32) * hsv.to(tl.float32)[None, :], axis=1)
        else:
            acc_s += ws.to(tl.float32) * hsv.to(tl.float32)[None, :]
"""
open(p, "w").write(s[:start] + old + s[end:])
print("pairs down: the broadcast of before restored")
PY
TAILN=14 run decode_pairs_down_before 120 $PROF
cp /tmp/pairs_new.py $F
cp src/hyserve/kernels/linear/configs/gemv.json /tmp/gemv.json
python3 - <<'PY'
import json
p = "src/hyserve/kernels/linear/configs/gemv.json"
cfg = json.load(open(p))
for plan in cfg["plans"].values():
    if isinstance(plan, dict) and not plan.get("TMA"):
        plan["BCAST_X"] = 1
json.dump(cfg, open(p, "w"), indent=1)
print("BCAST_X on in the pointer-load GEMV plans")
PY
TAILN=14 run decode_bcast_x 120 $PROF
cp /tmp/gemv.json src/hyserve/kernels/linear/configs/gemv.json
TAILN=8 run gdn_sweep 120 python3 -m hyserve.kernels.gdn_decode_step.bench --sweep
TAILN=4 run tests 100 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/linear \
  src/hyserve/kernels/gdn_decode_step src/hyserve/kernels/moe/test_moe.py -k "gemv or linear or pairs or step"
