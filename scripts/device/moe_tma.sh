#!/usr/bin/env bash
# The grouped MoE kernels (prefill, and batched decode at T >= 16) with their weights through TMA descriptors
# (the plans' new "TMA" option) on the H200: re-tune the buckets 32, 1024 and 4096 with the TMA variants among
# the candidates (the tune prints the best pointer-load and the best TMA time per kernel), the MoE tests of
# the TMA path and at real shapes with the new plans, then the prefill profile (first token without HTTP at
# 1024 and 4096). The JSON comes back in $OUT. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
cp src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json /tmp/moe_before.json
TAILN=2 run tune 270 python3 -m hyserve.kernels.moe.tune --tokens 32,1024,4096 --merge
cp src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json "$OUT/moe_after.json"
grep -E "pointer|best" $W/tune.log | cut -c1-400
TAILN=4 run pytest_tma 80 python3 -m pytest src/hyserve/kernels/moe/test_moe.py -x -q -p no:cacheprovider \
  -k "prefill_tma or (real_shapes and (auto or prefill))"
TAILN=2 run prefill 150 python3 scripts/profile_prefill.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192 --cuda-graph-sizes 1 --prompt-lens 1024,4096
grep -E "^== prompt|^ +[0-9.]+ +[0-9.]+ +[0-9.]+%" $W/prefill.log | cut -c1-120 | head -40
