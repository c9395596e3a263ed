#!/usr/bin/env bash
# The c=32 benchmark's request pattern without HTTP (closed loop: a new request when one finishes; the
# server's engine flags), twice; on an error, the same under CUDA_LAUNCH_BLOCKING=1 without CUDA graphs,
# which names the failing kernel. Results: $OUT/results.tgz.
set -u
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
W=/tmp/w; mkdir -p $W
M=configs/Qwen3.6-35B-A3B
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local s=$SECONDS
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; rc=$?; echo "rc=$rc in $((SECONDS - s)) s"; tail -n "${TAILN:-3}" "$W/$name.log"; return $rc; }
ARGS="--model $M --load-format dummy --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
  --requests 128 --concurrency 32 --prompt-len 1024,1024 --output-len 512,512"
if ! TAILN=30 run closed_loop 200 python3 scripts/stress_engine.py $ARGS --passes 2; then
  CUDA_LAUNCH_BLOCKING=1 TAILN=40 run blocking_eager 330 python3 scripts/stress_engine.py $ARGS --enforce-eager
fi
grep -E "^== pass|^ +(decode B=|mixed)|^new Triton|Error|error" $W/closed_loop.log | cut -c1-200 | head -40
tar czf "$OUT/results.tgz" -C $W .
