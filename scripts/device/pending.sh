#!/usr/bin/env bash
# The GPU checks that had not run by the end of 2026-12-03, in one call: the same-shape check of padded
# prefill graphs (check_prefill_graphs.py), the PDL graph-replay tests with a new input every replay, then as
# much of the kernel suite as the call has left (-x: the first failure stops it). Results: $OUT/results.tgz.
set -u
source "$(dirname "$0")/common.sh"
TAILN=8 run check 200 python3 scripts/check_prefill_graphs.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192
run pytest_pdl 150 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/test_pdl.py \
  src/hyserve/kernels/moe/test_moe.py -k "dependent or switch or cuda_graph"
grep -E "^FAILED|^E " $W/pytest_pdl.log | head -n 12
left=$((585 - SECONDS)); echo "kernel suite gets ${left} s"
run pytest_all $left python3 -m pytest -q -x -p no:cacheprovider src/hyserve/kernels
grep -E "^FAILED|^E " $W/pytest_all.log | head -n 12
tar czf "$OUT/results.tgz" -C $W .
