#!/usr/bin/env bash
# One call for the 2026-12-03 (second) session's changes, in priority order while time lasts (~580 s): GPU tests
# of the new kernels; the B=1 step at the server's shapes with the paged decode's fused reduce off / on (the
# faster goes on for the rest); the HTTP table (serve_bench.sh); the full-size verify; the prefill by kernel;
# the new kernels' benches. Carry .whl. Results: $OUT/results.tgz.
set -u
source "$(dirname "$0")/common.sh"
T0=$SECONDS
left() { [ $((SECONDS - T0)) -lt "$1" ]; }  # true while fewer than $1 seconds have passed
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
TAILN=4 run tests 110 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/gdn_gating \
  src/hyserve/kernels/qk_norm_rope src/hyserve/kernels/attention/test_attention.py -k "not test_prefill_real_shapes"
P="python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 \
  --max-model-len 8192 --prompt-len 384 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup"
J=src/hyserve/kernels/attention/configs/attention.json
TAILN=2 run off 90 $P
sed -i 's/"fused_reduce": false/"fused_reduce": true/' $J
TAILN=2 run on 90 $P
step() { awk '/^ +1 /{print $2}' $W/$1.log | tail -n 1; }
echo "B=1 step ms: fused_reduce off $(step off), on $(step on)"
for f in off on; do echo "== $f"; sed -n '/== batch 1:/,/^$/p' $W/$f.log | head -n 13; done
if ! awk -v a="$(step off)" -v b="$(step on)" 'BEGIN{exit !(b != "" && a != "" && b < a - 0.005)}'; then
  git checkout $J; echo "fused_reduce stays off"
else
  echo "fused_reduce on for the rest"
fi
OUT=$W/http bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95
tar czf "$OUT/results.tgz" -C $W .
left 430 && TAILN=14 run verify 160 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
  --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
tar czf "$OUT/results.tgz" -C $W .
left 500 && TAILN=2 run prefill 70 python3 scripts/profile_prefill.py --model $M --load-format dummy \
  --kv-cache-memory-gb 8 --max-num-seqs 8 --max-model-len 8192 --prompt-lens 1024,128 --reps 3 --top 30
grep -E "== prompt|TTFT" $W/prefill.log
left 540 && TAILN=20 run benches 40 sh -c "python3 -m hyserve.kernels.gdn_gating.bench; \
  python3 -m hyserve.kernels.qk_norm_rope.bench"
echo "total $((SECONDS - T0)) s"
tar czf "$OUT/results.tgz" -C $W .
