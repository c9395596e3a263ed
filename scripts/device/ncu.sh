#!/usr/bin/env bash
# Hardware counters of the decode-path kernels (scripts/ncu_ops.py) on the GPU: DRAM throughput, occupancy,
# stall reasons. Output: $OUT/ncu.txt; a one-line-per-kernel summary at the end.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2> /dev/null | head -n 1)
echo "ncu: $NCU"
timeout 400 "$NCU" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis \
  -k "regex:gate_up|down_|route|gdn_decode|nvjet|gemv|rms_norm|splitK" python3 scripts/ncu_ops.py > "$OUT/ncu.txt" 2>&1
echo "rc=$?"
grep -E "^  [_a-zA-Z].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Limit (Registers|Shared)" \
  "$OUT/ncu.txt" | sed 's/  \+/ /g' | cut -c1-110
