"""Micro-benchmark of silu_and_mul (bf16): [T, 2I] -> [T, I] for the expert width 512 and a dense 6144.

``python -m hyserve.kernels.activation.bench``: time (CUDA-graph replay, median), bytes moved, GB/s and
% of 4.0 TB/s, with the torch reference beside.
"""

from __future__ import annotations

import torch

from hyserve.kernels.activation.reference import silu_and_mul_reference
from hyserve.kernels.activation.triton_kernel import silu_and_mul_triton
from hyserve.kernels.rmsnorm.bench import DEVICE, DTYPE, HBM, Cycle, copies_for, time_ms


def bench(tokens: int, inter: int) -> dict:
    io = 3 * tokens * inter * 2
    inputs = [(torch.randn(tokens, 2 * inter, device=DEVICE, dtype=DTYPE),) for _ in range(copies_for(io))]
    ms = time_ms(Cycle(silu_and_mul_triton, inputs))
    ref = time_ms(Cycle(silu_and_mul_reference, inputs))
    return dict(
        op=f"silu_and_mul I={inter}",
        T=tokens,
        us=ms * 1e3,
        GBps=io / ms / 1e6,
        pct_hbm=100 * io / (ms * 1e-3) / HBM,
        ref_us=ref * 1e3,
    )


def run() -> list[dict]:
    return [bench(t, i) for i in (512, 6144) for t in (1, 32, 4096, 16384)]


def main() -> None:
    for r in run():
        print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
