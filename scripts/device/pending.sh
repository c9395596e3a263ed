#!/usr/bin/env bash
# The changes built on the CPU on 2026-12-04 (17th session) and not yet run on the H200, in three calls:
#   PART=1 (~5 min): GPU tests of the changed code (the pairs gate_up's options, the greedy screen in the engine,
#          the prefill graphs), then scripts/check_prefill_graphs.py (the graph's logprobs against the eager
#          prefill's, and a plain greedy request's token, which now comes from the LM head's greedy screen);
#          then scripts/http_floor.py at 1024 ids: how much of the ~2.6 ms HTTP adds here is the aiohttp client.
#   PART=2 (~6 min): the first token without HTTP, before (.base: `git archive 10fc263 src | tar -x -C .base`,
#          carried) against the tree, at LENS (128,1024): scripts/device/ab_prefill.sh. Expected ~-0.12 ms.
#   PART=3 (~4 min): the batch-1 step's plan options (`scripts/tune_step.py --groups options`, SHARED_FIRST
#          among them): what wins is in $OUT/options; copy its tables in, then verify_serve.sh.
#   PART=4 (~4 min): the GEMV over 12-bit packed bf16 weights (kernels/packed_bf16, 18th session): its GPU tests
#          (the prmt decode at the model's shapes), then `linear.bench --packed` at the model's GEMV shapes against
#          the committed bf16 plans. It pays off if the best packed tile takes clearly less than the bf16 plan
#          (0.75 of the time at most).
#   PART=5 (~5 min): the few-token MoE kernels over packed experts: their GPU tests and the model's with the
#          copies, then `moe.bench --pairs` (bf16 gate_up / down tiles, then "gate_up_pk" / "down_pk") and
#          `--grouped-packed` (the prefill's gate_up, bf16 against packed; if packed loses, set
#          "grouped": false in kernels/moe/configs/packed_pairs.json before PART=7).
#   PART=6 (~6 min): the batch-1 decode step with and without --pack-weights (scripts/profile_decode.py, the
#          same tree): the in-projections' and the experts' time added to the step, and the replay.
#   PART=7 (~6 min): the HTTP table with --pack-weights (serve_bench.sh; the start-up includes the packing).
#   PART=8 (~4 min): `hyserve verify` with --pack-weights (the same values: it must pass as without).
#   PART=9 (~9 min): the packed kernels' tiles tuned on the batch-1 step (tune_step.py --groups packed); what wins
#          is in $OUT/packed (gemv_packed.json, packed_pairs.json): copy in, then PART=7 and PART=8 again.
# Carry .whl (and .base for PART=2).
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
case "${PART:-1}" in
  1)
    TAILN=3 run tests 240 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_moe.py \
      -k "pairs_kernel_options" tests/test_greedy_screen.py tests/test_prefill_graphs.py
    TAILN=12 run check_prefill 300 python3 scripts/check_prefill_graphs.py --model $M --load-format dummy \
      --kv-cache-memory-gb 8 --max-num-seqs 8 --max-model-len 8192 --prompt-lens 100,128,1000,1024,4096 --reps 3
    TAILN=3 run http_floor 180 python3 scripts/http_floor.py --prompt-len 1024 --requests 60
    ;;
  2) LENS=${LENS:-128,1024} REPS=${REPS:-7} bash scripts/device/ab_prefill.sh ;;
  3) NAME=options BATCH=1 KNOBS=options PASSES=1 REPLAYS=200 LIMIT=500 bash scripts/device/tune_step.sh ;;
  4)
    TAILN=3 run tests 300 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/packed_bf16 \
      src/hyserve/kernels/linear/test_packed.py
    TAILN=40 run bench 400 python3 -m hyserve.kernels.linear.bench --packed \
      --shapes 12608x2048,2304x4096,9472x2048,2048x4096
    cp $W/bench.log $OUT/packed_bench.log
    ;;
  5)
    TAILN=3 run tests 300 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_pairs_packed.py \
      tests/test_packed_weights.py
    TAILN=30 run pairs 240 python3 -m hyserve.kernels.moe.bench --pairs
    TAILN=4 run grouped 120 python3 -m hyserve.kernels.moe.bench --grouped-packed --tokens 32,1024,4096
    ;;
  6)
    args=(--model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32 --max-model-len 8192 --prompt-len 384
      --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30 --no-warmup --top 12)
    TAILN=16 run packed 240 python3 scripts/profile_decode.py "${args[@]}" --pack-weights
    TAILN=16 run plain 200 python3 scripts/profile_decode.py "${args[@]}"
    ;;
  7) bash scripts/device/serve_bench.sh --max-num-seqs 48 --max-model-len 8192 --gpu-memory-utilization 0.95 \
       --pack-weights 2>&1 | grep -v "^hyserve:" | tail -n 40 ;;
  8)
    TAILN=8 run verify 400 python3 -m hyserve verify --model $M --load-format dummy --kv-cache-memory-gb 4 \
      --max-num-seqs 8 --max-model-len 4096 --paths fast --pack-weights
    ;;
  9) NAME=packed BATCH=1 KNOBS=packed PASSES=1 REPLAYS=200 LIMIT=540 EXTRA=--pack-weights \
       bash scripts/device/tune_step.sh ;;
  *) echo "PART must be 1 to 9" && exit 2 ;;
esac
