#!/usr/bin/env bash
# `--mma-experts-only` (the experts' bf16 weights released once their 12-bit copies exist: the model in ~54 GB, so it
# fits an H100 too) on whichever card comes (carry .whl): the GPU tests of the copies-only MoE and of the kernels it
# routes to, then
#   H200: the issue-4 HTTP table and the full-size `hyserve verify` with the flag (verify_serve.sh), ~9-10 min;
#   H100: the HTTP table at full size (serve_bench.sh), then `hyserve verify` at 16 layers with the flag against
#     --mma-experts (verify's transformers model unpacks the released experts into new bf16 tensors: the full
#     model's 64 GB of them fit an H200 only), ~9 min.
set -u
source "$(dirname "$0")/common.sh"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
timeout 240 python3 -m pytest -p no:cacheprovider -rfE src/hyserve/kernels/moe/test_mma_grouped.py \
  src/hyserve/kernels/moe/test_mma_pairs.py > "$OUT/t_only.log" 2>&1
echo "tests rc=$? $(grep -E '(passed|failed|error)' "$OUT/t_only.log" | tail -n 1)"
grep -E "^(FAILED|ERROR)" "$OUT/t_only.log" | head -n 5
if [ "$mem" -gt 100000 ]; then
  FLAGS=--mma-experts-only bash "$(dirname "$0")/verify_serve.sh" 2>&1 | tail -n 60
else
  bash "$(dirname "$0")/serve_bench.sh" --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
    --mma-experts-only 2>&1 | grep -v "^hyserve:" | tail -n 40
  FLAGS=--mma-experts-only CMP_FLAGS=--mma-experts bash "$(dirname "$0")/verify_depth.sh" 2>&1 | tail -n 20
fi
