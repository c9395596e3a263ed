#!/usr/bin/env bash
# The pre-norms and residual adds fused into the projections (a44bce9) on the H200, in two calls.
# PART=1: the GPU tests of the changed kernels (fused GEMV, MoE with norm + residual, graph replays with PDL),
# the T=1 pairs-kernel tile/stage sweep (moe/bench.py --pairs) and the decode-step profile (B=1, 32).
# PART=3: those tests again, then the profile three ways: as is, without PDL (per-op kernel times), attention
# qkv through cuBLAS at B=1 (gemv.json edited on the device).
# PART=2: the HTTP table (serve_bench.sh) and the full-size verify. Results: $OUT/results.tgz (+ verify.json).
set -u
source "$(dirname "$0")/common.sh"
if [ "${PART:-1}" = 1 ]; then
  run pytest 200 python3 -m pytest -q -x -p no:cacheprovider src/hyserve/kernels/test_pdl.py \
    src/hyserve/kernels/linear src/hyserve/kernels/moe/test_moe.py \
    -k "norm or residual or gemv or dependent or switch or cuda_graph or triton_paths"
  grep -E "^FAILED|^E " $W/pytest.log | head -n 12
  TAILN=16 run pairs 120 python3 -m hyserve.kernels.moe.bench --pairs
  TAILN=0 run profile 150 python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 \
    --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 --prefill-graph-sizes none --batch 1,32 \
    --steps 30 --no-warmup
  grep -h "== batch" $W/profile.log
  sed -n '/== batch 1:/,/^$/p' $W/profile.log | head -n 14
elif [ "${PART}" = 3 ]; then  # after the first profile: norm/residual loads moved before the waits
  run pytest 150 python3 -m pytest -q -x -p no:cacheprovider src/hyserve/kernels/linear \
    src/hyserve/kernels/moe/test_moe.py -k "fused or norm or residual or cuda_graph"
  grep -E "^FAILED|^E " $W/pytest.log | head -n 12
  prof() { TAILN=0 run "profile_$1" 120 env "${@:2}" python3 scripts/profile_decode.py --model $M --load-format dummy \
    --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 4096 --cuda-graph-sizes 1,32 \
    --prefill-graph-sizes none --batch 1,32 --steps 30 --no-warmup
    grep -h "== batch" $W/profile_$1.log; }
  prof default HYSERVE_PDL=1
  prof nopdl HYSERVE_PDL=0
  sed -n '/== batch 1:/,/^$/p' $W/profile_nopdl.log | head -n 16
  python3 -c 'import json; p="src/hyserve/kernels/linear/configs/gemv.json"; d=json.load(open(p))
d["plans"]["9216x2048"]="cublas"; json.dump(d, open(p, "w"))' 
  prof qkv_cublas HYSERVE_PDL=1
else
  OUT=$W bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95
  left=$((590 - SECONDS)); echo "verify gets ${left} s"
  TAILN=9 run verify $left python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
    --max-num-seqs 8 --max-model-len 4096 --paths fast --json "$OUT/verify.json"
fi
tar czf "$OUT/results.tgz" -C $W .
