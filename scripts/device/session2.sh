#!/usr/bin/env bash
# One-off (2026-12-03, second session, call 2): the DeltaNet prefill configs from the sweep, recorded.
# GPU tests of the DeltaNet kernels and the MoE routing (the scan over a grid), verify, the HTTP table, the prefill by kernel, and the HTTP part of the
# time to first token by stage on the H200 (host_ttft_timeline.py --model). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT  # every log straight into what comes back, in case the call runs out of time
TAILN=4 run gdn_tests 80 python3 -m pytest -q -p no:cacheprovider -x src/hyserve/kernels/gated_delta_rule
TAILN=4 run moe_tests 50 python3 -m pytest -q -p no:cacheprovider -x src/hyserve/kernels/moe/test_moe.py -k "routing or (real_shapes and prefill)"
TAILN=14 run verify 220 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95
TAILN=10 run timeline 70 python3 scripts/host_ttft_timeline.py --model $M --prompt-len 1024 --requests 30
TAILN=50 run prefill 80 python3 scripts/profile_prefill.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192 --prompt-lens 1024,4096 --reps 3 --top 24
