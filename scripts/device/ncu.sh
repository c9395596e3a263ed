#!/usr/bin/env bash
# Hardware counters of the batch-1 decode kernels (scripts/ncu_decode_kernels.py) on the H200: duration, DRAM
# throughput, achieved vs theoretical occupancy, registers, and warp stalls by reason, one line per kernel.
# ncu reads counters on the Firecracker runtime only (.library/device/KINDS.md): if it fails, that is why. ~2 min.
set -u
source "$(dirname "$0")/common.sh"
ncu --version | tail -n 1
TAILN=20 run ncu 300 ncu --clock-control none --target-processes all \
  -k regex:'gemv|router|pairs|gdn|paged|qk_norm' --csv --page raw \
  --metrics "$(python3 scripts/ncu_decode_kernels.py --metrics)" python3 scripts/ncu_decode_kernels.py
cp $W/ncu.log "$OUT/ncu.csv"
python3 scripts/ncu_decode_kernels.py --summarize $W/ncu.log
