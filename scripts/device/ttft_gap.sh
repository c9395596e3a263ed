#!/usr/bin/env bash
# Run on 2026-12-04 at 1e66758 (docs/performance.md: the idle gap changes nothing, HTTP adds ~1-2 ms). Prepared (~5 min from a cold machine): where the HTTP part of the time to first token goes, on one machine.
# The first token without HTTP at 128 / 1024 / 4096 tokens back to back and after 20 ms and 200 ms of an idle
# GPU (scripts/profile_prefill.py --gap-ms), then the HTTP table with the SM clock and power logged every 20 ms
# (nvidia-smi, $OUT/clocks.csv): HTTP has added 1.6 / 2.7 / 1.8 ms at 128 / 1024 / 4096 across runs on
# different machines and commits; if the idle gaps between the bench's sequential requests let the clocks
# drop, the gap runs show it without HTTP. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
args="--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 8 --max-model-len 8192"
for gap in 0 20 200; do
  TAILN=5 run prefill_gap$gap 200 python3 scripts/profile_prefill.py $args --prompt-lens 128,1024,4096 --reps 5 \
    --top 3 --gap-ms $gap
done
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate --format=csv -lms 20 > "$OUT/clocks.csv" &
smi=$!
bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 2>&1 \
  | grep -v "^hyserve:" | tail -n 30
kill $smi
awk -F', ' 'NR > 1 {print $2}' "$OUT/clocks.csv" | sort | uniq -c | sort -rn | head -n 8  # SM clock histogram
