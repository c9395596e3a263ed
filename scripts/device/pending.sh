#!/usr/bin/env bash
# What is left to run on the H200 of the changes built on the CPU, one call each (PART=1, the prefill graphs' check,
# ran on 2026-12-05: docs/performance.md):
#   PART=2 (~6 min): the first token without HTTP, before (.base: `git archive 10fc263 src | tar -x -C .base`,
#          carried) against the tree, at LENS (128,1024): scripts/device/ab_prefill.sh. Expected ~-0.12 ms.
#   PART=3 (~4 min): the batch-1 step's plan options (`scripts/tune_step.py --groups options`, SHARED_FIRST
#          among them): what wins is in $OUT/options; copy its tables in, then verify_serve.sh.
#   PART=4 (~2 min): scripts/probe_packed_dot_gemv.py as committed (its first form ran on 2026-12-05; this one
#          joins its two copies): `check` on the GPU, then `bench`, to confirm that row of docs/performance.md.
#   PART=5 (~7 min): the 20th session's prefill cuts (last rows, atomic routing) through HTTP on one machine:
#          scripts/device/ab_http.sh with .base = `git archive 1b65d68 src | tar -x -C .base`; then the atomic
#          routing's GPU check (`python3 -m hyserve.kernels.moe.gpu_check --atomic-routing`, also part of the full one).
#   PART=6 (~7 min): the DeltaNet prefill gates in the conv kernel (causal_conv1d_prefill_gated) and the grouped MoE
#          kernels' L2 eviction hints (cfg EVICT): their GPU tests, then ab_prefill.sh at LENS (128,1024) on three
#          trees: .base = `git archive 490beda src | tar -x -C .base` (before the gates), src, and .alt/src = src with
#          EVICT on in the MoE table's buckets >= 128 (carry .whl, .base, .alt). Make .alt with
#          rm -rf .alt && mkdir .alt && cp -r src .alt/ && python3 -c "import json; p = '.alt/src/hyserve/kernels/moe/\
#          configs/E256_H2048_I512_bfloat16.json'; d = json.load(open(p)); [v[k].update(EVICT=1) for b, v in \
#          d['buckets'].items() if v['down_mode'] == 'scatter' and int(b) >= 128 for k in ('gate_up', 'down')]; \
#          json.dump(d, open(p, 'w'), indent=1)"
#          Expected: gdn_gating's ~3.4 us a layer gone (~-0.1 ms at every length). Also the atomic routing's GPU check
#          (PART=5's second half: not run since 8c3e3a6 moved it into _route_large).
#   PART=7 (~7 min): the whole GPU kernel suite (scripts/device/kernel_tests.sh): last passed at 1375172, before the
#          atomic routing, the last-rows path, the conv's gates column and EVICT.
#   PART=8 (~6 min): decode_attention as one kernel (the decode config's fused_qk; q/k norm, RoPE and KV store inside
#          the paged decode's split kernel, triton_decode_qk.py): its GPU tests at the model's shapes, the
#          `attention.bench --qk` pairs, then the B=1 step with it off and on (tune_step.py --groups qk). Expected:
#          the qk_norm_rope_store launch gone (22.8 us added to the step over 10 layers), less what the split kernel
#          gains (the q norm and RoPE before its first dot; the k row in one program): ~-10 to -15 us a step.
#   PART=9 (~7 min; carry .whl, .alt2): the first layer's in-projection by token id (`--token-table`, layers/token_table.py): the B=1
#          step (ab_decode.sh) and the first token without HTTP at LENS (128,1024; ab_prefill.sh), each without and
#          with the flag in one tree. Expected: layer 0's in_proj GEMV (18.2 us added to the step at 20dd08c) becomes
#          a 25 KB gather (~-13 to -16 us a step); its GEMM at a prefill (~53 GFLOP at 1024 tokens: ~-75 us).
#          If it wins: turn it on by default (EngineArgs.token_table, its flag `--no-token-table`) after
#          `FLAGS=--token-table bash scripts/device/verify_serve.sh` (the HTTP table and `hyserve verify` with it).
#          The same call times the grouped gate_up's L2 prefetch (cfg L2PF / L2PF_E: during the routing's last
#          kernel its first programs prefetch the shared expert and the first 4 routed experts, 21 MB, which the
#          first blocks read) as a third tree, .alt2/src (carry it): its GPU test, then the prefill. Make .alt2 with
#          rm -rf .alt2 && mkdir .alt2 && cp -r src .alt2/ && python3 -c "import json; p = '.alt2/src/hyserve/\
#          kernels/moe/configs/E256_H2048_I512_bfloat16.json'; d = json.load(open(p)); [v['gate_up'].update(\
#          L2PF=132, L2PF_E=4) for b, v in d['buckets'].items() if v['down_mode'] == 'scatter' and int(b) >= 128]; \
#          json.dump(d, open(p, 'w'), indent=1)"
#          Expected: at most the 21 MB's ~5 us a layer (~-0.2 ms a prefill), if they stay in L2 until read.
#   PART=10 (~8 min; carry .whl, .alt): the DeltaNet decode step's whole-head tile (BV 128) with the early loads
#          (state, conv windows and gates before the PDL wait; baf5e2c made them possible for BV = V at batch <= 4):
#          its GPU tests, `bench` at B 1/2/4 for BV 32/64/128, then the B=1 step (ab_decode.sh) against .alt/src =
#          src with _CONFIGS' first entry (4, 128, 4), twice each. Make .alt with rm -rf .alt && mkdir .alt && cp -r
#          src .alt/ && sed -i 's/^_CONFIGS = ((4, 32, 4),/_CONFIGS = ((4, 128, 4),/' \
#          .alt/src/hyserve/kernels/gdn_decode_step/triton_kernel.py
#          Expected: the norm's ticket and .cg reload (~1.5 us a layer) gone, against 4x the tile per program.
#          Last, `gated_delta_rule.bench`: the DeltaNet kernels beside fla-core's (never recorded so far).
# Suggested order for a fresh session (~30 device minutes, ~3 of them per cold start): PART=6, PART=8, PART=9; turn
# on what won (the MoE table's EVICT, attention.json's fused_qk), commit, then verify_serve.sh (the HTTP table and
# `hyserve verify` at that commit); PART=7 with what is left.
# The 12-bit packed kernels (`--pack-weights`) were timed on 2026-12-05 and are not faster (docs/performance.md):
# `python3 -m hyserve.kernels.linear.bench --packed` and `python3 -m hyserve.kernels.moe.bench --pairs` are the
# first gate for a new version of them. Carry .whl (and .base for PART=2).
set -u
source "$(dirname "$0")/common.sh"
W=$OUT
case "${PART:-2}" in
  2) LENS=${LENS:-128,1024} REPS=${REPS:-7} bash scripts/device/ab_prefill.sh ;;
  3) NAME=options BATCH=1 KNOBS=options PASSES=1 REPLAYS=200 LIMIT=500 bash scripts/device/tune_step.sh ;;
  4)
    TAILN=5 run probe_check 120 python3 scripts/probe_packed_dot_gemv.py check
    TAILN=40 run probe_bench 240 python3 scripts/probe_packed_dot_gemv.py bench
    ;;
  5)
    bash scripts/device/ab_http.sh
    TAILN=8 run atomic_check 120 python3 -m hyserve.kernels.moe.gpu_check --atomic-routing
    ;;
  6)
    TAILN=3 run conv_tests 300 python3 -m pytest -q src/hyserve/kernels/causal_conv1d src/hyserve/kernels/gdn_gating
    TAILN=3 run moe_tests 300 python3 -m pytest -q src/hyserve/kernels/moe/test_moe.py -k "real_shapes and prefill"
    TAILN=8 run atomic_check 150 python3 -m hyserve.kernels.moe.gpu_check --atomic-routing
    SIDES=${SIDES:-before:.base/src after:src alt:.alt/src} LENS=${LENS:-128,1024} REPS=${REPS:-7} TOP=${TOP:-16} \
      ROUNDS=${ROUNDS:-1} bash scripts/device/ab_prefill.sh
    ;;
  7) bash scripts/device/kernel_tests.sh ;;
  8)
    TAILN=3 run attention_tests 300 python3 -m pytest -q src/hyserve/kernels/attention
    TAILN=14 run qk_bench 120 python3 -m hyserve.kernels.attention.bench --qk
    NAME=qk BATCH=1 KNOBS=qk PASSES=1 REPLAYS=300 LIMIT=240 bash scripts/device/tune_step.sh
    ;;
  9)
    TAILN=3 run table_tests 200 python3 -m pytest -q -p no:cacheprovider \
      tests/test_token_table.py::test_cuda_steps_match_the_plain_engine \
      src/hyserve/kernels/moe/test_moe.py::test_grouped_l2_prefetch_changes_nothing
    # a 4 GiB KV cache on both sides: the table's 5.8 GiB must fit beside the model on an H100 too
    SIDES="plain:src table:src:--token-table" TESTS=none KVGB=4 SEQS=8 bash scripts/device/ab_decode.sh
    SIDES="plain:src table:src:--token-table l2pf:.alt2/src" LENS=${LENS:-128,1024} REPS=${REPS:-7} \
      ROUNDS=${ROUNDS:-1} KVGB=4 bash scripts/device/ab_prefill.sh
    ;;
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
  *) echo "PART must be 2 to 10" && exit 2 ;;
esac
