#!/usr/bin/env bash
# Whole-prefill CUDA graphs (opt-in, engine/prefill_graphs.py) on the H200: first-token logprobs against the
# eager prefill and both times to first token without HTTP (check_prefill_graphs.py), then the HTTP table
# with the graphs on. Results: $OUT/results.tgz.
set -u
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
W=/tmp/w; mkdir -p $W
M=configs/Qwen3.6-35B-A3B
SIZES=128,256,512,1024,2048,4096
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local s=$SECONDS
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; echo "rc=$? in $((SECONDS - s)) s"; tail -n "${TAILN:-3}" "$W/$name.log"; }
TAILN=8 run check 240 python3 scripts/check_prefill_graphs.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192 --prefill-graph-sizes $SIZES
grep -E "prefill CUDA graph|captured prefill|graph capture took" $W/check.log
OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
  --prefill-graph-sizes $SIZES
tar czf "$OUT/results.tgz" -C $W .
