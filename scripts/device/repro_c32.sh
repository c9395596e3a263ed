#!/usr/bin/env bash
# The c=32 benchmark's request pattern without HTTP (closed loop: a new request when one finishes; the
# server's engine flags), with decode graphs for batches >= 8 only, then with every size; a failing run
# prints the steps before the failure. Results: $OUT/results.tgz.
set -u
source "$(dirname "$0")/common.sh"
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local s=$SECONDS
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; rc=$?; echo "rc=$rc in $((SECONDS - s)) s"
  grep -E "^== pass|^failed step|^steps before|^ +(decode B=|mixed)" "$W/$name.log" | cut -c1-900 | head -n 20; }
ARGS="--model $M --load-format dummy --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
  --requests 128 --concurrency 32 --prompt-len 1024,1024 --output-len 512,512"
run graphs_ge8 150 python3 scripts/stress_engine.py $ARGS --cuda-graph-sizes 8,16,24,32,48
run graphs_all 150 python3 scripts/stress_engine.py $ARGS
tar czf "$OUT/results.tgz" -C $W .
