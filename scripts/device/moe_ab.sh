#!/usr/bin/env bash
# A MoE kernel change against its base in one device call: the MoE GPU tests of the grouped paths and the routing,
# scripts/device/moe_wide.py --committed (the kernels alone at the committed plans of 32 / 128 / 1024 / 4096
# tokens) on .base/src and on the tree, then ab_prefill.sh (the first token without HTTP, alternated).
# Before: `rm -rf .base && mkdir .base && git archive <base> src | tar -x -C .base`; carry .base and .whl.
# Env: LENS for ab_prefill.sh (128,1024). ~8 min from a cold Triton cache.
set -u
source "$(dirname "$0")/common.sh"
TAILN=3 run tests 200 python3 -m pytest -q -p no:cacheprovider -rfE src/hyserve/kernels/moe/test_moe.py \
  -k "routing or prefill_tma or (real_shapes and (auto or prefill))"
PYTHONPATH=/tmp/site:.base/src TAILN=12 run base_wide 150 python3 scripts/device/moe_wide.py --tokens 32,128,1024,4096 --committed
TAILN=12 run wide 150 python3 scripts/device/moe_wide.py --tokens 32,128,1024,4096 --committed
LENS=${LENS:-128,1024} bash "$(dirname "$0")/ab_prefill.sh"
