"""Micro-benchmark of rms_norm at hidden 2048 (bf16), plain and fused with the residual add.

``python -m hyserve.kernels.rmsnorm.bench``: time (CUDA-graph replay, median), bytes moved, GB/s and % of
4.0 TB/s, with the torch reference beside.
"""

from __future__ import annotations

import torch

from hyserve.kernels.rmsnorm.reference import rms_norm_reference
from hyserve.kernels.rmsnorm.triton_kernel import rms_norm_triton

HBM = 4.0e12
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU (interpreter) only smoke-tests this file
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


COLD_BYTES = 256 << 20  # inputs rotate over this much memory so repeated calls miss the L2


def copies_for(io_bytes: int) -> int:
    """How many input copies keep back-to-back calls out of the L2 (1 on the CPU)."""
    return max(1, min(256, COLD_BYTES // max(1, io_bytes))) if DEVICE == "cuda" else 1


class Cycle:
    """Calls ``fn(*inputs[i])`` with i cycling over the copies."""

    def __init__(self, fn, inputs: list[tuple]) -> None:
        self.fn, self.inputs, self.i = fn, inputs, 0

    def __call__(self):
        self.i = (self.i + 1) % len(self.inputs)
        return self.fn(*self.inputs[self.i])


def time_ms(fn, rep: int = 20) -> float:
    """Median milliseconds of ``fn`` replayed from a CUDA graph (eager wall time on the CPU)."""
    if DEVICE != "cuda":
        import time

        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing as tt

    return tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")


def bench(rows: int, hidden: int = 2048, residual: bool = True) -> dict:
    io = rows * hidden * 2 * (4 if residual else 2)
    w = torch.randn(hidden, device=DEVICE, dtype=DTYPE)
    inputs = []
    for _ in range(copies_for(io)):
        x = torch.randn(rows, hidden, device=DEVICE, dtype=DTYPE)
        inputs.append((x, w, 1e-6, torch.randn_like(x) if residual else None))
    ms = time_ms(Cycle(rms_norm_triton, inputs))
    ref = time_ms(Cycle(rms_norm_reference, inputs))
    return dict(
        op="rms_norm+res" if residual else "rms_norm",
        T=rows,
        us=ms * 1e3,
        GBps=io / ms / 1e6,
        pct_hbm=100 * io / (ms * 1e-3) / HBM,
        ref_us=ref * 1e3,
    )


def run() -> list[dict]:
    return [bench(t, residual=res) for res in (True, False) for t in (1, 32, 256, 4096, 16384)]


def main() -> None:
    for r in run():
        print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
