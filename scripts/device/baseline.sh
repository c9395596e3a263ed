#!/usr/bin/env bash
# First look at the H200: environment, full-size dummy load, verify (bf16), eager engine speed.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm --format=csv
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
M=configs/Qwen3.6-35B-A3B
time python3 -m hyserve --log-level INFO verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json $OUT/verify.json 2>&1 | grep -v "Loading" | tee $OUT/verify.log
time python3 scripts/offline_speed.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 \
  --max-model-len 4096 --batch 1,32 --prompt-len 128 --output-len 32 2>&1 | tee $OUT/speed.log
