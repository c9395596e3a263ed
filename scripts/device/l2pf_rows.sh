#!/usr/bin/env bash
# The GEMV's L2 prefetch of a prefix of W (each of the first L2PF programs prefetches its own rows) on the H200
# (~6 min from a cold machine; carry .whl): its GPU test, the step tuner over the "l2pf" group at batch 1, the
# tables it keeps copied into this tree, then the HTTP table (serve_bench.sh). A prefetch changes no bits (the
# test compares them), so `hyserve verify` is not re-run here. Tables kept: $OUT/l2pf_rows.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
TAILN=3 run tests 120 python3 -m pytest -q -x src/hyserve/kernels/linear/test_linear.py -k "l2 or L2PF"
TAILN=30 NAME=l2pf_rows BATCH=1 KNOBS=l2pf PASSES=1 REPLAYS=200 LIMIT=200 bash "$(dirname "$0")/tune_step.sh"
cp "$OUT/l2pf_rows/gemv.json" src/hyserve/kernels/linear/configs/gemv.json
cp "$OUT/l2pf_rows/E256_H2048_I512_bfloat16.json" src/hyserve/kernels/moe/configs/
cp "$OUT/l2pf_rows/attention.json" src/hyserve/kernels/attention/configs/
bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 2>&1 \
  | grep -v "^hyserve:" | grep -E "^(decode|ttft|throughput|server ready)" 
