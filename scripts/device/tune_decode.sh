#!/usr/bin/env bash
# Decode-path kernels on the GPU: tests at real shapes of the GEMV and the MoE pairs path, the GEMV tile
# sweep (writes kernels/linear/configs/gemv.json), the MoE tune for T <= 8 (merged into its JSON), the GDN
# decode-step sweep, then the decode-step profile with the new tiles. Results: $OUT/results.tgz and the
# two JSON files. The sweeps time each kernel alone: keep what they write only if the profile's step improves
# (plan options that won alone have lost in the step: docs/performance.md, 2026-12-03).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
W=/tmp/w; mkdir -p $W
M=configs/Qwen3.6-35B-A3B
run() { local name=$1 limit=$2; shift 2; echo "== $name"; local s=$SECONDS
  timeout "$limit" "$@" > "$W/$name.log" 2>&1; echo "rc=$? in $((SECONDS - s)) s"; tail -n "${TAILN:-3}" "$W/$name.log"; }
run pytest 150 python3 -m pytest src/hyserve/kernels/linear src/hyserve/kernels/moe -q -x -p no:cacheprovider \
  -k "linear or gemv or pairs or topk or dispatch"
TAILN=8 run gemv 150 python3 -m hyserve.kernels.linear.bench --write
cp src/hyserve/kernels/linear/configs/gemv.json "$OUT/"
run tune 200 python3 -m hyserve.kernels.moe.tune --tokens 1,2,4,8 --merge
cp src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json "$OUT/"
grep -h "pairs:\|best" $W/tune.log | cut -c1-220
run gdn 100 python3 -m hyserve.kernels.gdn_decode_step.bench --sweep
grep "best\|suggested" $W/gdn.log
run profile 170 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --batch 1,32 --steps 20
sed -n '/== batch 1:/,/^$/p' $W/profile.log | head -n 20; tail -n 4 $W/profile.log
tar czf "$OUT/results.tgz" -C $W .
