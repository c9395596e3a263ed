#!/usr/bin/env bash
# The MoE prefill branches of 2026-12-04 in one device call, each against main: x-pipelined (the grouped
# gate_up's x gather through cp.async stages) and gate-up-pair (gate and up tiles in one TMA box, one dot).
# Per branch: the MoE GPU tests of its paths and scripts/device/moe_wide.py --committed (the kernels alone at
# the committed plans of 32 / 128 / 1024 / 4096 tokens; 32 is the c=32 decode step), then, once,
# scripts/device/moe_diag.py (the copies' one-dot variant). Run from main with the branches' sources unpacked:
# `for b in x-pipelined gate-up-pair; do mkdir -p .br/$b && git archive $b src | tar -x -C .br/$b; done`;
# carry .br and .whl. ~6 min from a warm Triton cache.
set -u
source "$(dirname "$0")/common.sh"
TAILN=12 run main_wide 150 python3 scripts/device/moe_wide.py --tokens 32,128,1024,4096 --committed
for b in x-pipelined gate-up-pair; do
  PYTHONPATH=/tmp/site:.br/$b/src TAILN=3 run "${b}_tests" 150 python3 -m pytest -q -p no:cacheprovider -rfE \
    .br/$b/src/hyserve/kernels/moe/test_moe.py -k "prefill_tma or one_descriptor or (real_shapes and (auto or prefill))"
  PYTHONPATH=/tmp/site:.br/$b/src TAILN=12 run "${b}_wide" 150 python3 scripts/device/moe_wide.py \
    --tokens 32,128,1024,4096 --committed
done
TAILN=20 run diag 100 python3 scripts/device/moe_diag.py --tokens 1024,4096
