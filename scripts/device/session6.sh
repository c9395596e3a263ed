#!/usr/bin/env bash
# One-off (2026-12-03, third session): the prefill by kernel with the chunk solve on 8 warps (edited on the device
# only), the full-size verify of the fast path, then the HTTP table (serve_bench.sh). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
F=src/hyserve/kernels/gated_delta_rule/triton_prefill.py
cp $F /tmp/prefill_4w.py
sed -i 's/    "prepare": {"num_warps": 4},/    "prepare": {"num_warps": 8},/' $F
grep -c '"prepare": {"num_warps": 8}' $F
TAILN=22 run prefill_8w 60 python3 scripts/profile_prefill.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192 --prompt-lens 1024,4096 --reps 3 --top 6
cp /tmp/prefill_4w.py $F
TAILN=14 run verify 230 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 --max-num-seqs 8 \
  --max-model-len 4096 --paths fast
timeout 280 bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95
