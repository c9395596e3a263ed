#!/usr/bin/env bash
# Prefill on the H200: re-tune the MoE buckets 128..8192 (merged into the JSON, copied to $OUT), the MoE
# prefill tests at real shapes with the new tiles, the prefill profile (TTFT without HTTP, kernels by
# name at 128 / 1024 / 4096 tokens), then the c=32 workload offline (async launch with a queue).
# Results: $OUT/results.tgz and the MoE JSON.
set -u
source "$(dirname "$0")/common.sh"
run tune 200 python3 -m hyserve.kernels.moe.tune --tokens 128,256,512,1024,2048,4096,8192 --merge
cp src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json "$OUT/"
grep -h "best" $W/tune.log | cut -c1-60,200-260
run pytest_moe 90 python3 -m pytest src/hyserve/kernels/moe -x -q -p no:cacheprovider -k "real_shapes and (auto or prefill)"
grep -E "passed|failed|^FAILED|^E " $W/pytest_moe.log | head -n 12
TAILN=5 run prefill 120 python3 scripts/profile_prefill.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192 --cuda-graph-sizes 1 --prompt-lens 128,1024,4096
grep -E "^== prompt|^ +[0-9.]+ +[0-9.]+ +[0-9.]+%" $W/prefill.log | cut -c1-120
run c32_offline 130 python3 scripts/stress_engine.py --model $M --load-format dummy \
  --max-num-seqs 32 --max-model-len 8192 --gpu-memory-utilization 0.95 --requests 128 \
  --prompt-len 1024,1024 --output-len 512,512 --log-compiles
grep -E "^== pass|^ +(decode B=32|mixed)|^decode ms|^new Triton" $W/c32_offline.log | cut -c1-200
tar czf "$OUT/results.tgz" -C $W .
