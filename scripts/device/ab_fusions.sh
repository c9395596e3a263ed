#!/usr/bin/env bash
# One-off (2026-12-03): GPU tests of this session's kernels (gdn_gating, qk_norm_rope_store, the paged decode's
# fused reduce) and the graph check, their benches, the B=1 step at the server's shapes with the fused reduce off
# and on, the prefill by kernel at 1024 / 128 tokens, then the DeltaNet bench sweep (the chunk solve's warps).
set -u
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
TAILN=4 run tests 200 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/gdn_gating \
  src/hyserve/kernels/qk_norm_rope src/hyserve/kernels/attention/test_attention.py src/hyserve/kernels/test_pdl.py \
  -k "not test_prefill_real_shapes"
TAILN=6 run graphcheck 120 python3 -m hyserve.kernels.gpu_check_small_ops --no-sweep --no-bench
TAILN=40 run benches 150 sh -c "python3 -m hyserve.kernels.gdn_gating.bench; python3 -m hyserve.kernels.qk_norm_rope.bench; \
  python3 -m hyserve.kernels.attention.bench --fused --no-reference"
P="python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 \
  --max-model-len 8192 --prompt-len 384 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup"
TAILN=2 run off 100 $P
J=src/hyserve/kernels/attention/configs/attention.json
sed -i 's/"fused_reduce": false/"fused_reduce": true/' $J
TAILN=2 run on 100 $P
git checkout $J
TAILN=2 run off2 100 $P
for f in off on off2; do echo "== $f"; sed -n '/== batch 1:/,/^$/p' $W/$f.log | head -n 14; done
TAILN=2 run prefill 150 python3 scripts/profile_prefill.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 8192 --prompt-lens 1024,128 --reps 3 --top 30
grep -A 32 "== prompt 1024" $W/prefill.log | head -n 33; grep "== prompt 128" $W/prefill.log
tar czf "$OUT/results.tgz" -C $W .
TAILN=30 run gdn_sweep 140 python3 -m hyserve.kernels.gated_delta_rule.bench --sweep
grep -E "best|prefill" $W/gdn_sweep.log | tail -n 30
tar czf "$OUT/results.tgz" -C $W .
