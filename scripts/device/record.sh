#!/usr/bin/env bash
# The numbers of record on the GPU, in one call: MoE routing tune for T=16..64 (merged), the full-size
# verify of the fast path (Triton kernels, CUDA graphs, async scheduling), the HTTP benchmark table
# (serve_bench.sh; flags sized to fit an 80 GB H100 too) and the decode-step profile. Carry .whl.
# ENGINE_FLAGS (optional) go to verify and the server, e.g. ENGINE_FLAGS="--prefill-graph-sizes none"
# (verify's max-model-len 4096 bounds the sizes it takes to 4095). Results: $OUT/results.tgz, the MoE JSON,
# verify.json.
set -u
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "${SKIP_TUNE:-0}" != 1 ]; then
  run tune 90 python3 -m hyserve.kernels.moe.tune --tokens 16,32,64 --merge
  cp src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json "$OUT/"
  grep -h "routing:" $W/tune.log
fi
TAILN=14 run verify 240 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json" ${ENGINE_FLAGS:-}
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
  ${ENGINE_FLAGS:-}
run profile 120 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --batch 1,32 --steps 20
sed -n '/== batch 1:/,/^$/p' $W/profile.log | head -n 16
tar czf "$OUT/results.tgz" -C $W .
