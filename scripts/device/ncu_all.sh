#!/usr/bin/env bash
# Nsight Compute on the H200 (it reads counters on this runtime since 2026-12-03): the batch-1 decode kernels
# alone (scripts/device/ncu.sh: duration, DRAM %, occupancy, stalls by reason), then the 1024-token prefill's
# DeltaNet kernels (speed of light, occupancy, warp states). ~4 min. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
bash scripts/device/ncu.sh
TAILN=200 run ncu_prefill 150 ncu --clock-control none --section SpeedOfLight --section Occupancy \
  --section WarpStateStats -k regex:'_prepare_kernel|_state_output_kernel|_conv_prefill_kernel' \
  --launch-skip 3 -c 3 python3 scripts/ncu_prefill_kernels.py --tokens 1024 --reps 3 > /dev/null
grep -E "_kernel \(|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Block Limit" \
  $W/ncu_prefill.log | head -n 60
cp $W/ncu_prefill.log "$OUT/"
