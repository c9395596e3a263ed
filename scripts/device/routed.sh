#!/usr/bin/env bash
# The MoE router's logits in the mixers' projections (kernels/routed_projection, layers/routed_projection.py):
# GPU tests, the batch-1 profile with it and without it (--no-routed-projections), then `hyserve verify` with one
# prompt (it decodes alone: the one-token steps the feature changes; the default four prompts decode together)
# and with the default prompts. ~7 min from a cold machine. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
K=src/hyserve/kernels
TAILN=4 run tests 200 python3 -m pytest -q -p no:cacheprovider -rfE $K/routed_projection \
  $K/linear/test_linear.py -k "routed or raw or project or linearity or gemv_fused or gemv_matches"
prof() { python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 \
  --max-model-len 8192 --prompt-len 384 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 \
  --no-warmup --top 14 "$@"; }
TAILN=22 run prof_on 150 prof
TAILN=4 run prof_off 150 prof --no-routed-projections
TAILN=12 run verify_one 200 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --prompt-lens 1000 --greedy-tokens 64
TAILN=12 run verify 200 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast
