"""Micro-benchmark of logits_argmax at the LM head's shape (bf16 [N, 248320] -> fp32 + argmax).

``python -m hyserve.kernels.argmax.bench``: time (CUDA-graph replay, median), bytes moved, GB/s and % of
4.0 TB/s, with the torch reference (``.float()`` then ``.argmax(-1)``) beside.
"""

from __future__ import annotations

import torch

from hyserve.kernels.argmax.reference import logits_argmax_reference
from hyserve.kernels.argmax.triton_kernel import logits_argmax_triton
from hyserve.kernels.rmsnorm.bench import DEVICE, DTYPE, HBM, Cycle, copies_for, time_ms


def bench(rows: int, vocab: int = 248320) -> dict:
    io = rows * vocab * (2 + 4)
    inputs = [(torch.randn(rows, vocab, device=DEVICE, dtype=DTYPE),) for _ in range(copies_for(io))]
    ms = time_ms(Cycle(logits_argmax_triton, inputs))
    ref = time_ms(Cycle(logits_argmax_reference, inputs))
    return dict(
        op="logits_argmax",
        N=rows,
        us=ms * 1e3,
        GBps=io / ms / 1e6,
        pct_hbm=100 * io / (ms * 1e-3) / HBM,
        ref_us=ref * 1e3,
    )


def run() -> list[dict]:
    return [bench(n) for n in (1, 4, 32)]


def main() -> None:
    for r in run():
        print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
