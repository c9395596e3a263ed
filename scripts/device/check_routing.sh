#!/usr/bin/env bash
# MoE routing variants and the decode step after the split routing: routing micro-benchmark (graph-replayed
# us per variant and T), the routing and real-shape MoE tests, the decode-step profile (B=1, 32), then the
# c=32 workload offline with a kernel profile of 20 of its decode steps and the GPU clocks/power sampled
# every second (does a long run throttle?). Results: $OUT/results.tgz.
set -u
source "$(dirname "$0")/common.sh"
TAILN=7 run routing 120 python3 -m hyserve.kernels.moe.bench --routing
TAILN=2 run moe_sum 60 python3 -m hyserve.kernels.moe.bench --tokens 1,32,64 --no-ref
run pytest_moe 120 python3 -m pytest src/hyserve/kernels/moe -x -q -p no:cacheprovider \
  -k "routing or topk or (real_shapes and (auto or unfused_router))"
grep -E "passed|failed|^FAILED|^E " $W/pytest_moe.log | head -n 12
TAILN=4 run profile 130 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --batch 1,32 --prompt-len 1024 --steps 30 \
  --no-warmup
grep -E "_route|_topk|_group|_sum_kernel|_router" $W/profile.log
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 1000 > $W/smi.log 2>&1 &
SMI=$!
run c32_offline 170 python3 scripts/stress_engine.py --model $M --load-format dummy \
  --max-num-seqs 32 --max-model-len 8192 --gpu-memory-utilization 0.95 --requests 128 \
  --prompt-len 1024,1024 --output-len 512,512 --log-compiles --profile-at 1200
kill $SMI
grep -E "^== pass|^ +(decode B=32|mixed)|^decode ms|^profiled|^ +[0-9.]+ +[0-9.]+ +[0-9.]+%|^new Triton|^    " \
  $W/c32_offline.log | cut -c1-200
awk 'NR % 5 == 1' $W/smi.log | head -n 40
tar czf "$OUT/results.tgz" -C $W .
