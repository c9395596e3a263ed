#!/usr/bin/env bash
# The session's last H200 call: re-tune the MoE prefill buckets 128, 256, 512, 2048 and 8192 with the grouped
# kernels' TMA variants among the candidates (merged into the JSON, copied to $OUT); the full-size verify;
# the HTTP benchmarks (serve_bench.sh); then, with what time is left, Nsight Compute's speed-of-light and
# memory sections of the grouped gate_up and down kernels at 1024 tokens (is it DRAM or L2 that bounds them?).
# Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=1 run tune 110 python3 -m hyserve.kernels.moe.tune --tokens 128,256,512,2048,8192 --merge
cp src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json "$OUT/moe_after.json"
grep -E "pointer|best" $W/tune.log | cut -c1-330
TAILN=9 run verify 250 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast
bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
  > "$OUT/serve_bench.txt" 2>&1
grep -E "server ready|^decode |^ttft |^throughput " "$OUT/serve_bench.txt"
TAILN=60 run ncu 90 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
  -k regex:'_gate_up_kernel|_down_kernel' --launch-skip 4 -c 2 python3 -m hyserve.kernels.moe.bench --tokens 1024 --no-ref
