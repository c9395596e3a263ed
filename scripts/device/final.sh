#!/usr/bin/env bash
# One-shot H200 check: full-size verify on both paths, engine speed with CUDA graphs, kernel tests.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
M=configs/Qwen3.6-35B-A3B
run() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"; }
run verify 200 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 --max-num-seqs 8 \
  --max-model-len 4096 --paths reference,fast --json $OUT/verify.json
run speed 130 python3 scripts/offline_speed.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 \
  --max-model-len 4096 --cuda-graph-sizes 1,32 --batch 1,32 --prompt-len 128 --output-len 64
run pytest_kernels 70 python3 -m pytest src/hyserve/kernels -q -x -p no:cacheprovider
grep -v "Loading\|transformers\]" "$OUT/verify.log" | tail -n 22
tail -n 8 "$OUT/speed.log"; tail -n 15 "$OUT/pytest_kernels.log"
