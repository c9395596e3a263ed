#!/usr/bin/env bash
# What was prepared on the CPU on 2026-12-03 and not yet timed, on the H200, most important first:
# 1. the decode profile (B=1, 32) of the committed state (the exact latency cuts: packed-key top-k, early
#    loads in the DeltaNet step, paged attention, KV store and q/k-norm + RoPE);
# 2. B=1 again with the pairs plans' split_shared on (gemv/MoE JSON edited on the device only);
# 3. the T=1 pairs sweep with REDUCE_EACH / PREFETCH (moe/bench.py --pairs);
# 4. the in_proj / out_proj GEMV sweep with REDUCE_EACH (linear/bench.py --write --merge; the LM head streams
#    at ~4.3 TB/s already, and an isolated sweep would hand the qkv back to cuBLAS, no better in the engine
#    with the norm fused: 2.467 against 2.459 ms);
# 5. the pairs buckets re-tuned with the options (tune.py --tokens 1,2,4 --merge), and B=1 with what won.
# The swept JSONs come back in $OUT for review and commit. Carry .whl. Two calls: PART=1 runs the GPU tests of
# the changed kernels first, then 1-2; PART=2 runs 3-5.
set -u
source "$(dirname "$0")/common.sh"
MOE=src/hyserve/kernels/moe/configs/E256_H2048_I512_bfloat16.json
prof() { TAILN=0 run "$1" 120 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
  --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes "$2" --prefill-graph-sizes none --batch "$2" \
  --steps 30 --no-warmup; grep -h "== batch" "$W/$1.log"; }
if [ "${PART:-1}" = 1 ]; then
run pytest 280 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/test_pdl.py \
  src/hyserve/kernels/attention src/hyserve/kernels/gdn_decode_step src/hyserve/kernels/qk_norm_rope \
  src/hyserve/kernels/linear src/hyserve/kernels/moe/test_moe.py -k "not real_shapes and not reference_vs_float64"
grep -E "^FAILED|^E " $W/pytest.log | head -n 12
prof profile 1,32
cp $MOE $W/moe_committed.json
python3 -c "import json; p='$MOE'; d=json.load(open(p))
for t in ('1', '2', '4'): d['buckets'][t]['split_shared'] = True
json.dump(d, open(p, 'w'), indent=1)"
prof profile_split 1
cp $W/moe_committed.json $MOE
sed -n '/== batch 1:/,/^$/p' $W/profile.log | head -n 24
tar czf "$OUT/results1.tgz" -C $W .
exit 0
fi
TAILN=18 run pairs 120 python3 -m hyserve.kernels.moe.bench --pairs
TAILN=20 run gemv 200 python3 -m hyserve.kernels.linear.bench --shapes 12352x2048,2048x4096 \
  --block-k 512,1024,2048 --write --merge
TAILN=8 run tune 150 python3 -m hyserve.kernels.moe.tune --tokens 1,2,4 --merge
cp src/hyserve/kernels/linear/configs/gemv.json $MOE "$OUT/"
prof profile_swept 1
tar czf "$OUT/results.tgz" -C $W .
