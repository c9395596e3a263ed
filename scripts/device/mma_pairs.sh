#!/usr/bin/env bash
# The one-token MoE kernels over the experts' 12-bit copies (moe/mma_pairs.py) in one device call: their GPU tests
# (and MORE_TESTS), `moe.bench --mma-pairs`, then the batch-1 decode step (ab_decode.sh) on the model cut to LAYERS
# (16) layers with --mma-experts: neither kernel (off: the module's switches off), the down only (down), both (both),
# and both with the gate_up's tiles of each TILES entry ("2,2 4,1": trees made here). KINDS (off down both)
# picks the first three. Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
P=src/hyserve/kernels/moe/mma_pairs.py
NONE="GATE_UP_TILES: tuple[int, int] | None = None"
sides=""
for kind in ${KINDS:-off down both}; do
  case $kind in
    both) sides+=" both:src:--mma-experts" ;;
    *) rm -rf .$kind && mkdir -p .$kind && cp -r src .$kind/ && sides+=" $kind:.$kind/src:--mma-experts" ;;
  esac
done
[ -d .off ] && sed -i "s/^MAX_TOKENS = .*$/MAX_TOKENS = 0/; s/^GATE_UP_TILES: .*$/$NONE/" .off/$P
[ -d .down ] && sed -i "s/^GATE_UP_TILES: .*$/$NONE/" .down/$P
for t in ${TILES:-}; do
  d=.t${t//,/}; rm -rf $d && mkdir -p $d && cp -r src $d/
  sed -i "s/^GATE_UP_TILES: .*$/GATE_UP_TILES: tuple[int, int] | None = ($t)/" $d/$P
  sides+=" t${t//,/}:$d/src:--mma-experts"
done
grep -H "^MAX_TOKENS\|^GATE_UP_TILES" .*/$P $P 2> /dev/null
if [ "${TESTS:-}" != none ]; then
  TAILN=12 run tests 400 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_mma_pairs.py ${MORE_TESTS:-}
fi
TAILN=40 run bench 200 python3 -m hyserve.kernels.moe.bench --mma-pairs
LAYERS=${LAYERS:-16} SIDES="$sides" TESTS=none KVGB=4 SEQS=8 TOP=${TOP:-10} bash scripts/device/ab_decode.sh
