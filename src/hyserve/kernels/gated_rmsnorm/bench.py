"""Micro-benchmark of gated_rms_norm at the DeltaNet shape (32 heads x 128 per token, bf16).

``python -m hyserve.kernels.gated_rmsnorm.bench``: time (CUDA-graph replay, median), bytes moved, GB/s and
% of 4.0 TB/s, with the torch reference beside.
"""

from __future__ import annotations

import torch

from hyserve.kernels.gated_rmsnorm.reference import gated_rms_norm_reference
from hyserve.kernels.gated_rmsnorm.triton_kernel import gated_rms_norm_triton
from hyserve.kernels.rmsnorm.bench import DEVICE, DTYPE, HBM, Cycle, copies_for, time_ms


def bench(tokens: int, heads: int = 32, dim: int = 128) -> dict:
    io = 3 * tokens * heads * dim * 2
    w = torch.randn(dim, device=DEVICE, dtype=DTYPE)
    inputs = []
    for _ in range(copies_for(io)):
        x = torch.randn(tokens, heads, dim, device=DEVICE, dtype=DTYPE)
        inputs.append((x, torch.randn_like(x), w, 1e-6))
    ms = time_ms(Cycle(gated_rms_norm_triton, inputs))
    ref = time_ms(Cycle(gated_rms_norm_reference, inputs))
    return dict(
        op="gated_rms_norm",
        T=tokens,
        us=ms * 1e3,
        GBps=io / ms / 1e6,
        pct_hbm=100 * io / (ms * 1e-3) / HBM,
        ref_us=ref * 1e3,
    )


def run() -> list[dict]:
    return [bench(t) for t in (1, 32, 256, 4096, 16384)]


def main() -> None:
    for r in run():
        print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
