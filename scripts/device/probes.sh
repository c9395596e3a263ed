#!/usr/bin/env bash
# Prepared for the next H200 session (~3 min). First the kernel-boundary probe: 40 dependent GEMVs as 40 PDL
# launches against one persistent kernel with grid-wide barriers, with and without the next weights loaded
# before each barrier (scripts/probe_persistent_gemv.py): what a persistent decode layer could save per
# boundary. Then Nsight Compute: the causal conv's tiles at 1024 and 4096 tokens (scripts/ncu_prefill_kernels.py
# --conv-sweep: each tile launched twice, the second read), and the B=1 decode kernels again
# (scripts/device/ncu.sh, with the attention kernels this time). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
for pps in 2 4; do
  TAILN=6 run probe_pps$pps 90 python3 scripts/probe_persistent_gemv.py --layers 40 --programs-per-sm $pps
done
for t in 1024 4096; do
  TAILN=0 run conv_$t 60 ncu --clock-control none --section SpeedOfLight -k regex:_conv_prefill_kernel \
    python3 scripts/ncu_prefill_kernels.py --tokens $t --conv-sweep
  grep -E "^conv tile" $W/conv_$t.log
  grep -E "Duration" $W/conv_$t.log | awk -v t=$t 'NR % 2 == 0 {print t, "tokens: tile", NR / 2, $NF, "us"}'
done
bash scripts/device/ncu.sh
cp $W/conv_*.log "$OUT/"
