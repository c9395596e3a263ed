#!/usr/bin/env bash
# One-off (2026-12-03, third session): the scatter down's fused sum on the GPU (tests, real-shape bitwise check,
# `moe.bench --breakdown`: down + sum kernel against the sum in the down's tail), the DeltaNet chunk solve's
# substitution before and after (error vs the reference, time), then the prefill by kernel, before and after
# turning the fused sum on in the MoE plans (on the device only). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=4 run tests 60 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_moe.py \
  -k "routing_and_grouping or fused_sum or prefill" src/hyserve/kernels/gated_delta_rule/test_gated_delta_rule.py
TAILN=6 run fused_check 60 python3 -m hyserve.kernels.moe.gpu_check --fused-sum
TAILN=8 run moe_bench 90 python3 -m hyserve.kernels.moe.bench --tokens 32,1024,4096 --no-ref --breakdown
# the chunk solve's forward substitution: the old row extraction (over the middle axis) against the new
F=src/hyserve/kernels/gated_delta_rule/triton_prefill.py
cp $F /tmp/new_prefill.py
python3 - <<'PY'
p = "src/hyserve/kernels/gated_delta_rule/triton_prefill.py"
s = open(p).read()
s = s.replace("a_i = tl.sum(tl.where(r16[None, None, :] == i, d_t, 0.0), 2)", "a_i = tl.sum(tl.where(rows == i, diag, 0.0), 1)")
open(p, "w").write(s)
PY
TAILN=5 run gdn_old 90 python3 scripts/device/gdn_prefill_check.py
cp /tmp/new_prefill.py $F
TAILN=5 run gdn_new 90 python3 scripts/device/gdn_prefill_check.py
PROF="python3 scripts/profile_prefill.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 8 \
  --max-model-len 8192 --prompt-lens 1024,4096 --reps 3 --top 10"
TAILN=30 run prefill_sum_kernel 80 $PROF
python3 - <<'PY'
import json
path = "src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json"
cfg = json.load(open(path))
for k, b in cfg["buckets"].items():
    if b["down_mode"] == "scatter":
        b["down"]["fused_sum"] = True
json.dump(cfg, open(path, "w"), indent=1)
print("fused_sum on for the scatter buckets")
PY
TAILN=30 run prefill_fused_sum 80 $PROF
