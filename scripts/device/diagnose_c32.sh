#!/usr/bin/env bash
# Where the c=32 benchmark's time goes, without HTTP: the workload offline with a per-step-kind breakdown
# (stress_engine.py), the decode-step profile at the benchmark's context length with graph-replay-only
# timing (profile_decode.py), then the kernel tests at real shapes. Results: $OUT/results.tgz.
set -u
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
W=/tmp/w; mkdir -p $W
M=configs/Qwen3.6-35B-A3B
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local s=$SECONDS
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; echo "rc=$? in $((SECONDS - s)) s"; tail -n "${TAILN:-3}" "$W/$name.log"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
TAILN=16 run c32_offline 200 python3 scripts/stress_engine.py --model $M --load-format dummy \
  --max-num-seqs 32 --max-model-len 8192 --gpu-memory-utilization 0.95 --requests 128 \
  --prompt-len 1024,1024 --output-len 512,512
TAILN=6 run profile 150 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --batch 1,32 --prompt-len 1024 --steps 20 \
  --no-warmup --top 30
sed -n '/== batch 32:/,/^$/p' $W/profile.log | head -n 34
run pytest_kernels 200 python3 -m pytest src/hyserve/kernels -q -p no:cacheprovider
grep -E "passed|failed" $W/pytest_kernels.log | tail -n 3
tar czf "$OUT/results.tgz" -C $W .
