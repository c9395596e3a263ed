#!/usr/bin/env bash
# Where the c=32 benchmark's time goes, without HTTP: the workload offline, twice in one process, with a
# per-step-kind breakdown and the Triton kernel variants each pass compiled (stress_engine.py); then the
# kernel tests at real shapes (KERNEL_TESTS, default all). Results: $OUT/results.tgz.
set -u
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
run c32_offline 300 python3 scripts/stress_engine.py --model $M --load-format dummy \
  --max-num-seqs 32 --max-model-len 8192 --gpu-memory-utilization 0.95 --requests 128 \
  --prompt-len 1024,1024 --output-len 512,512 --passes 2 --log-compiles
grep -E "^== pass|^ +(decode B=32|mixed)|^slowest|^new Triton" $W/c32_offline.log
grep -A40 "^new Triton" $W/c32_offline.log | grep "^    " | cut -c1-150 | sort | uniq -c | sort -rn | head -30
run pytest_kernels 200 python3 -m pytest ${KERNEL_TESTS:-src/hyserve/kernels} -x -q -p no:cacheprovider
grep -E "passed|failed|Error|^FAILED|^E " $W/pytest_kernels.log | head -n 30
tar czf "$OUT/results.tgz" -C $W .
