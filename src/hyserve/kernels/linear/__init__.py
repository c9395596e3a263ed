"""``y = x W^T`` without bias: the model's projections and LM head.

Few rows (decode at small batch, x [M <= 4, K]) go to the Triton GEMV (``triton_kernel.py``) where
``configs/gemv.json`` has a plan for the weight's (N, K) and that plan is not ``"cublas"``; everything
else (prefill, bigger batches, shapes the sweep found cuBLAS faster on) goes to ``F.linear``. The JSON is
written by ``python -m hyserve.kernels.linear.bench --write`` on the GPU.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.linear.reference import linear_reference

CONFIG_PATH = Path(__file__).parent / "configs" / "gemv.json"
GEMV_MAX_ROWS = 4  # rows of x the GEMV takes; more go to cuBLAS (a GEMM reuses each W tile across rows)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.cache
def _plans() -> dict[str, dict | str]:
    if not CONFIG_PATH.exists():
        return {}
    return json.loads(CONFIG_PATH.read_text())["plans"]


def gemv_plan(n: int, k: int) -> dict | None:
    """The tuned GEMV tiles for a weight [n, k], or None (cuBLAS) when there is none or cuBLAS won."""
    plan = _plans().get(f"{n}x{k}")
    return plan if isinstance(plan, dict) else None


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N] (the contract of ``linear_reference``)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (
        0 < rows <= GEMV_MAX_ROWS
        and x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and weight.stride(-1) == 1
        and triton_enabled(x, weight)
    ):
        plan = gemv_plan(*weight.shape)
        if plan is not None:
            from hyserve.kernels.linear.triton_kernel import gemv_triton

            x2 = x.reshape(rows, x.shape[-1])
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            return gemv_triton(x2, weight, plan).reshape(*x.shape[:-1], weight.shape[0])
    return linear_reference(x, weight)


__all__ = ["GEMV_MAX_ROWS", "gemv_plan", "linear", "linear_reference"]
