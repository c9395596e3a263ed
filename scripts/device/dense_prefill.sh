#!/usr/bin/env bash
# causal_attention (a lone fresh prompt's attention over its own rows, cuDNN SDPA) on the H200: its GPU tests and
# the prefill-graph tests, then the first token without HTTP after / before (.base/src, carried), one round each.
set -u
source "$(dirname "$0")/common.sh"
TAILN=3 run tests 200 python3 -m pytest -q -p no:cacheprovider -x src/hyserve/kernels/attention/test_causal.py \
  tests/test_prefill_graphs.py
args=(--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 8 --max-model-len 8192
  --cuda-graph-sizes 1 --prompt-lens "${LENS:-128,1024,4096}" --reps "${REPS:-5}" --top 12)
TAILN=4 run after 200 python3 scripts/profile_prefill.py "${args[@]}"
PYTHONPATH=/tmp/site:.base/src TAILN=4 run before 200 python3 scripts/profile_prefill.py "${args[@]}"
grep -E "attention|_gate_kernel|cudnn|flash|fmha|sdpa" /tmp/w/after.log | head -12
