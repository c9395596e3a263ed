#!/usr/bin/env bash
# Whole-prefill CUDA graphs (engine/prefill_graphs.py, default buckets 128..4096) on the H200: first-token
# logprobs against the eager prefill and both times to first token without HTTP (check_prefill_graphs.py),
# then the HTTP table with the graphs on. Results: $OUT/results.tgz.
set -u
source "$(dirname "$0")/common.sh"
TAILN=8 run check 240 python3 scripts/check_prefill_graphs.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192
grep -E "prefill CUDA graph|captured prefill|graph capture took" $W/check.log
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95
tar czf "$OUT/results.tgz" -C $W .
