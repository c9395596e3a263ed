#!/usr/bin/env bash
# One-off (2026-12-03, second session, call 3): the routing tests on the GPU, the paged prefill attention's tiles (`attention.bench
# --sweep-prefill`, beside torch SDPA's flash backend), then the prefill by kernel with the best of them
# written into configs/attention.json (on the device only). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=3 run routing_tests 30 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_moe.py -k routing_and_grouping
TAILN=30 run attn 150 python3 -m hyserve.kernels.attention.bench --sweep-prefill --no-reference
python3 - <<'PY'
import json, os
line = [l for l in open(os.environ["OUT"] + "/attn.log") if l.startswith("best configs")][-1]
best = json.loads(line.split(": ", 1)[1])["prefill"]
path = "src/hyserve/kernels/attention/configs/attention.json"
cfg = json.load(open(path))
print("prefill 256 was", cfg["prefill"]["256"], "-> now", best)
cfg["prefill"]["256"] = best
json.dump(cfg, open(path, "w"), indent=2)
PY
TAILN=40 run prefill 70 python3 scripts/profile_prefill.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192 --prompt-lens 1024,4096 --reps 3 --top 8
