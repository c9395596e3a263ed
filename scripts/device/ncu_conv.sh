#!/usr/bin/env bash
# Nsight Compute on the H200: the causal conv's tiles at 1024 and 4096 tokens (scripts/ncu_prefill_kernels.py
# --conv-sweep: each tile launched twice, the second read), then the B=1 decode kernels again
# (scripts/device/ncu.sh, with the attention kernels this time). ~2 min. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
for t in 1024 4096; do
  TAILN=0 run conv_$t 60 ncu --clock-control none --section SpeedOfLight -k regex:_conv_prefill_kernel \
    python3 scripts/ncu_prefill_kernels.py --tokens $t --conv-sweep
  grep -E "^conv tile" $W/conv_$t.log
  grep -E "Duration" $W/conv_$t.log | awk -v t=$t 'NR % 2 == 0 {print t, "tokens: tile", NR / 2, $NF, "us"}'
done
bash scripts/device/ncu.sh
cp $W/conv_*.log "$OUT/"
