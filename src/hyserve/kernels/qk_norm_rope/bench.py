"""Micro-benchmark of qk_norm_rope at the attention shape (q 16 x 256 as a view of [T, 16, 512], k 2 x 256,
rotary 64, bf16).

``python -m hyserve.kernels.qk_norm_rope.bench``: time (CUDA-graph replay, median), bytes moved, GB/s and
% of 4.0 TB/s, with the torch reference beside.
"""

from __future__ import annotations

import torch

from hyserve.kernels.qk_norm_rope.reference import qk_norm_rope_reference, rope_cos_sin
from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_triton
from hyserve.kernels.rmsnorm.bench import DEVICE, DTYPE, HBM, Cycle, copies_for, time_ms


def bench(tokens: int, hq: int = 16, hk: int = 2, dim: int = 256, rot: int = 64) -> dict:
    io = 2 * tokens * (hq + hk) * dim * 2 + 2 * tokens * (rot // 2) * 4
    qw = torch.randn(dim, device=DEVICE, dtype=DTYPE)
    kw = torch.randn(dim, device=DEVICE, dtype=DTYPE)
    positions = torch.arange(tokens, device=DEVICE)
    cos, sin = rope_cos_sin(positions, rot, 1e7)
    inputs = []
    for _ in range(copies_for(io)):
        q = torch.randn(tokens, hq, 2 * dim, device=DEVICE, dtype=DTYPE)[..., :dim]
        k = torch.randn(tokens, hk, dim, device=DEVICE, dtype=DTYPE)
        inputs.append((q, k, qw, kw, 1e-6, cos, sin, positions, rot))
    ms = time_ms(Cycle(qk_norm_rope_triton, inputs))
    ref = time_ms(Cycle(qk_norm_rope_reference, inputs))
    return dict(
        op="qk_norm_rope",
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
