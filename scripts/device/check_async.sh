#!/usr/bin/env bash
# After an engine-loop change: decode-step profile (engine step vs bare graph replay, B=1 and 32), the c=32
# workload offline (one pass, compile log), then the MoE kernel tests at real shapes. Results: $OUT/results.tgz.
set -u
source "$(dirname "$0")/common.sh"
TAILN=4 run profile 150 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --batch 1,32 --prompt-len 1024 --steps 30 \
  --no-warmup
run c32_offline 200 python3 scripts/stress_engine.py --model $M --load-format dummy \
  --max-num-seqs 32 --max-model-len 8192 --gpu-memory-utilization 0.95 --requests 128 \
  --prompt-len 1024,1024 --output-len 512,512 --log-compiles
grep -E "^== pass|^ +(decode B=32|mixed)|^slowest|^new Triton|^    " $W/c32_offline.log | cut -c1-300
run pytest_moe 150 python3 -m pytest src/hyserve/kernels/moe -x -q -p no:cacheprovider
grep -E "passed|failed|^FAILED|^E " $W/pytest_moe.log | head -n 12
tar czf "$OUT/results.tgz" -C $W .
