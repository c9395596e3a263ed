#!/usr/bin/env bash
# One-off (routed projections, third try): GPU tests of the routed projection and the pairs options, then the
# B=1 step tuner with the routed projections on (gate_up's tiles and L2 prefetch) and off (the options group,
# gate_up's BCAST_X among them). Env: PART (tests+on | off).
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
K=src/hyserve/kernels
TUNE="python3 scripts/tune_step.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 8
  --max-model-len 8192 --replays 300 --passes 1 --batch 1"
if [ "${PART:-on}" = on ] && [ -z "${SKIP_TESTS:-}" ]; then
  TAILN=4 run tests 200 python3 -m pytest -p no:cacheprovider -q -rfE $K/routed_projection \
    $K/moe/test_moe.py -k "options or routing or route or pairs"
fi
case "${PART:-on}" in
  on) TAILN=60 run tune_on 420 $TUNE --groups "${KNOBS:-moe,l2pf}" --out $OUT/on ;;
  off) TAILN=60 run tune_off 420 $TUNE --groups "${KNOBS:-options}" --no-routed-projections --out $OUT/off ;;
esac
if [ "${PART:-on}" = profile ]; then
  P="python3 scripts/profile_decode.py --model $M --load-format dummy --kv-cache-memory-gb 8 --max-num-seqs 32
    --max-model-len 8192 --prompt-len 384 --cuda-graph-sizes 1 --prefill-graph-sizes none --batch 1 --steps 30
    --no-warmup --top 24"
  TAILN=45 run prof_on 200 $P
  TAILN=45 run prof_off 200 $P --no-routed-projections
fi
