#!/usr/bin/env bash
# The one-token MoE kernels over the experts' 12-bit copies (moe/mma_pairs.py) in one device call: their GPU tests
# (and MORE_TESTS), `moe.bench --mma-pairs`, then the batch-1 decode step (ab_decode.sh) on the model cut to LAYERS
# (16) layers with --mma-experts three ways: neither kernel (.off: the module's switches off), the down only (.down),
# both (src). Carry .whl.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
P=src/hyserve/kernels/moe/mma_pairs.py
for d in .off .down; do rm -rf $d && mkdir -p $d && cp -r src $d/; done
sed -i 's/^MAX_TOKENS = .*$/MAX_TOKENS = 0/; s/^GATE_UP_TILES: .*$/GATE_UP_TILES: tuple[int, int, int] | None = None/' .off/$P
sed -i 's/^GATE_UP_TILES: .*$/GATE_UP_TILES: tuple[int, int, int] | None = None/' .down/$P
grep -H "^MAX_TOKENS\|^GATE_UP_TILES" .off/$P .down/$P $P
TAILN=12 run tests 400 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/moe/test_mma_pairs.py ${MORE_TESTS:-}
TAILN=40 run bench 200 python3 -m hyserve.kernels.moe.bench --mma-pairs
LAYERS=${LAYERS:-16} SIDES="off:.off/src:--mma-experts down:.down/src:--mma-experts both:src:--mma-experts" TESTS=none \
  KVGB=4 SEQS=8 TOP=${TOP:-10} bash scripts/device/ab_decode.sh
