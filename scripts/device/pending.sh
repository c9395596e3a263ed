#!/usr/bin/env bash
# What is left to run on the H200 of the changes built on the CPU, one call each. The parts that ran (1-6, 8, 9:
# docs/performance.md, 2026-12-05) are gone; `git show f67f8e6:scripts/device/pending.sh` has them.
#   PART=7 (~7 min; carry .whl): the whole GPU kernel suite (scripts/device/kernel_tests.sh): last passed at
#          1375172, before the atomic routing, the last-rows path, the conv's gates column, EVICT, L2PF, fused_qk and
#          the DeltaNet step's EARLY (each of those passed its own GPU tests since).
#   PART=10 (~8 min; carry .whl, .alt): the DeltaNet decode step's whole-head tile (BV 128) with the early loads
#          (state, conv windows and gates before the PDL wait; baf5e2c made them possible for BV = V at batch <= 4):
#          its GPU tests, `bench` at B 1/2/4 for BV 32/64/128, then the B=1 step (ab_decode.sh) against .alt/src =
#          src with _CONFIGS' first entry (4, 128, 4), twice each. Make .alt with rm -rf .alt && mkdir .alt && cp -r
#          src .alt/ && sed -i 's/^_CONFIGS = ((4, 32, 4),/_CONFIGS = ((4, 128, 4),/' \
#          .alt/src/hyserve/kernels/gdn_decode_step/triton_kernel.py
#          Expected: the norm's ticket and .cg reload (~1.5 us a layer) gone, against 4x the tile per program.
#          Last, `gated_delta_rule.bench`: the DeltaNet kernels beside fla-core's (never recorded so far).
# Left for a session with time to spare: EVICT over several rounds (PART=6 of f67f8e6 with ROUNDS=3; one round was
# inside the noise). The 12-bit packed kernels (`--pack-weights`) were timed on 2026-12-05 and are not faster:
# `python3 -m hyserve.kernels.linear.bench --packed` and `python3 -m hyserve.kernels.moe.bench --pairs` are the
# first gate for a new version of them.
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
case "${PART:-}" in
  7) bash scripts/device/kernel_tests.sh ;;
  10)
    TAILN=3 run gdn_tests 300 python3 -m pytest -q -p no:cacheprovider src/hyserve/kernels/gdn_decode_step
    TAILN=20 run gdn_bench 200 python3 -c "
from hyserve.kernels.gdn_decode_step.bench import bench
for b in (1, 2, 4):
    for bv, w in ((32, 4), (64, 4), (128, 4), (128, 8)):
        r = bench(b, bv, w, baselines=False)
        print(f'B={b} BV={bv} warps={w}: {r[\"us\"]:.2f} us')
"
    SIDES=${SIDES:-split:src whole:.alt/src split2:src whole2:.alt/src} TESTS=none bash scripts/device/ab_decode.sh
    # the DeltaNet kernels against fla-core's (from the carried wheels): decode B 1-64, prefill 128-4096 tokens
    TAILN=16 run gdr_bench 150 python3 -m hyserve.kernels.gated_delta_rule.bench
    ;;
  *) echo "PART must be 7 or 10" && exit 2 ;;
esac
