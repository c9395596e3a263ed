"""The 1024-token prefill's DeltaNet kernels (chunked delta rule, causal conv) alone, for Nsight Compute.

Each op runs three times on one layer's fresh inputs at the model's shapes (32 value heads, K = V = 128,
8192 conv channels), eagerly, so ``ncu -k regex:... --launch-skip 3`` reads a warm launch of each kernel:

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        -k regex:'_prepare_kernel|_state_output_kernel|_conv_prefill_kernel' python3 scripts/ncu_prefill_kernels.py

``--conv-sweep`` instead launches the conv alone with each (BT, BD, warps) tile of ``CONV_TILES``, the interior blocks'
fast path off then on, twice each, in that order (printed), so the ncu durations of the second launches compare them
without host timing noise.
"""

from __future__ import annotations

import argparse

import torch

CONV_TILES = ((32, 128, 4), (16, 256, 4), (16, 128, 4), (64, 128, 8), (32, 256, 8), (64, 256, 8), (8, 512, 4))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--conv-sweep", action="store_true", help="the conv alone, each tile of CONV_TILES twice")
    a = ap.parse_args()
    from hyserve.kernels.causal_conv1d import bench as conv_bench
    from hyserve.kernels.causal_conv1d.triton_kernel import causal_conv1d_prefill_triton
    from hyserve.kernels.gated_delta_rule.bench import prefill_inputs
    from hyserve.kernels.gated_delta_rule.triton_prefill import gated_delta_rule_prefill_triton

    conv_args = conv_bench.inputs([a.tokens])
    if a.conv_sweep:
        for bt, bd, nw in CONV_TILES:
            for fast in (False, True):
                print(
                    f"conv tile BT={bt} BD={bd} warps={nw} interior fast path {int(fast)}: two launches",
                    flush=True,
                )
                for _ in range(2):
                    causal_conv1d_prefill_triton(
                        *conv_args, block_t=bt, block_d=bd, num_warps=nw, interior_fast_path=fast
                    )
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return
    args = prefill_inputs([a.tokens])
    for _ in range(a.reps):
        gated_delta_rule_prefill_triton(*args)
        causal_conv1d_prefill_triton(*conv_args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
