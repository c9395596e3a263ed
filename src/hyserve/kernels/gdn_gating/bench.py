"""Micro-benchmark of gdn_gating (bf16 a, b; HV = 32, the 35B model's value heads): one launch against the
reference's eight torch ops.

``python -m hyserve.kernels.gdn_gating.bench``: time (CUDA-graph replay, median) of both at prefill lengths.
"""

from __future__ import annotations

import torch

from hyserve.kernels.gdn_gating.reference import gdn_gating_reference
from hyserve.kernels.gdn_gating.triton_kernel import gdn_gating_triton
from hyserve.kernels.rmsnorm.bench import DEVICE, DTYPE, Cycle, copies_for, time_ms

HEADS = 32


def bench(tokens: int) -> dict:
    io = tokens * HEADS * (2 + 2 + 4 + 2)
    inputs = []
    for _ in range(copies_for(io)):
        proj = torch.randn(tokens, 2 * HEADS, device=DEVICE, dtype=DTYPE)
        params = torch.randn(2, HEADS, device=DEVICE)
        inputs.append((proj[:, HEADS:], proj[:, :HEADS], params[0], params[1]))
    ms = time_ms(Cycle(gdn_gating_triton, inputs))
    ref = time_ms(Cycle(gdn_gating_reference, inputs))
    return dict(op="gdn_gating HV=32", T=tokens, us=ms * 1e3, ref_us=ref * 1e3)


def main() -> None:
    for t in (128, 1024, 4096, 8192):
        r = bench(t)
        print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
