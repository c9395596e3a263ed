#!/usr/bin/env bash
# One-off (2026-12-03, third session): the scatter down's fused sum on the GPU (tests, real-shape bitwise check,
# `moe.bench --breakdown`: down + sum kernel against the sum in the down's tail), the paged prefill attention's
# tiles (`attention.bench --sweep-prefill`; the best written into attention.json on the device only), then the
# prefill by kernel, before and after turning the fused sum on in the MoE plans (on the device only). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=4 run tests 60 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_moe.py \
  -k "routing_and_grouping or fused_sum or prefill"
TAILN=6 run fused_check 60 python3 -m hyserve.kernels.moe.gpu_check --fused-sum
TAILN=8 run moe_bench 90 python3 -m hyserve.kernels.moe.bench --tokens 32,1024,4096 --no-ref --breakdown
TAILN=30 run attn 150 python3 -m hyserve.kernels.attention.bench --sweep-prefill --no-reference
python3 - <<'PY'
import json, os
lines = [l for l in open(os.environ["OUT"] + "/attn.log") if l.startswith("best configs")]
if lines:
    best = json.loads(lines[-1].split(": ", 1)[1])["prefill"]
    path = "src/hyserve/kernels/attention/configs/attention.json"
    cfg = json.load(open(path))
    print("prefill 256 was", cfg["prefill"]["256"], "-> now", best)
    cfg["prefill"]["256"] = best
    json.dump(cfg, open(path, "w"), indent=2)
PY
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
