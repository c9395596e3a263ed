#!/usr/bin/env bash
# The register-lean kernel options of 2026-12-03 (REDUCE_EACH in the GEMV and the pairs MoE kernels, PREFETCH
# in the pairs kernels; all default off) on the H200, in one call: the T=1 pairs sweep (moe/bench.py --pairs),
# the GEMV sweep of in_proj and out_proj with and without REDUCE_EACH (linear/bench.py
# --write --merge; the LM head streams at ~4.3 TB/s already, and the isolated sweep would hand the qkv back
# to cuBLAS, no better in the engine with the norm fused: 2.467 against 2.459 ms), the pairs buckets re-tuned with the options
# (tune.py --tokens 1,2,4 --merge), then the decode profile (B=1, 32) with what won, and B=1 again with the
# pairs plans' split_shared on. The JSONs come back in $OUT for review and commit. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
TAILN=18 run pairs 120 python3 -m hyserve.kernels.moe.bench --pairs
TAILN=20 run gemv 240 python3 -m hyserve.kernels.linear.bench --shapes 12352x2048,2048x4096 \
  --block-k 512,1024,2048 --write --merge
TAILN=8 run tune 200 python3 -m hyserve.kernels.moe.tune --tokens 1,2,4 --merge
cp src/hyserve/kernels/linear/configs/gemv.json src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json "$OUT/"
TAILN=0 run profile 120 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --prefill-graph-sizes none --batch 1,32 \
  --steps 30 --no-warmup
grep -h "== batch" $W/profile.log
python3 -c 'import json; p="src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json"; d=json.load(open(p))
for t in ("1", "2", "4"): d["buckets"][t]["split_shared"] = True
json.dump(d, open(p, "w"), indent=1)'
TAILN=0 run profile_split 90 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 8 --max-model-len 4096 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup
grep -h "== batch" $W/profile_split.log  # with split_shared at T <= 4 (the JSON in $OUT is without)
tar czf "$OUT/results.tgz" -C $W .
