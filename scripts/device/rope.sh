#!/usr/bin/env bash
# The decode attention with its q/k-norm + RoPE + KV-store prologue (kernels/attention/triton_decode_rope.py):
# GPU tests at real shapes, then the step tuner's "rope" group (prologue off / on, and the fused merge) at batch 1
# and 2, then the by-op profile at batch 1 as committed. ~6 min from a cold machine. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
K=src/hyserve/kernels
TAILN=4 run tests 200 python3 -m pytest -q -p no:cacheprovider -rfE $K/attention/test_decode_rope.py \
  $K/attention/test_attention.py $K/qk_norm_rope
for b in 1 2; do
  TAILN=14 run "rope_b$b" 170 python3 scripts/tune_step.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
    --max-num-seqs 8 --max-model-len 8192 --groups "$([ $b = 1 ] && echo rope,attention || echo rope)" --replays 200 --passes 1 --batch $b --out "$OUT/rope_b$b"
done
TAILN=30 run prof 150 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 8192 --prompt-len 384 --cuda-graph-sizes 1 --prefill-graph-sizes none \
  --batch 1 --steps 30 --no-warmup --top 16
