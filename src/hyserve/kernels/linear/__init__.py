"""``y = [residual +] rms_norm(x) W^T`` without bias: the model's projections and LM head.

Few rows (decode at small batch, x [M <= 4, K], or fewer where the plan's ``"max_rows"`` says so) go to the
Triton GEMV (``triton_kernel.py``) where ``configs/gemv.json`` has a plan for the weight's (N, K) and that plan is
not ``"cublas"``; everything else (prefill, bigger batches, shapes the sweep found cuBLAS faster on) goes to
cuBLAS, after the Triton ``rms_norm`` when there is a norm, with the residual added in cuBLAS's epilogue
(``addmm_``). The JSON is written by ``python -m hyserve.kernels.linear.bench --write`` on the GPU.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.linear.reference import linear_reference
from hyserve.kernels.rmsnorm import rms_norm

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


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N]: ``[residual +] rms_norm(x) W^T`` (the contract of
    ``linear_reference``; with a residual, it is updated in place and returned)."""
    if residual is not None and residual.shape != (*x.shape[:-1], weight.shape[0]):
        raise ValueError(
            f"residual {tuple(residual.shape)} does not match the output {(*x.shape[:-1], weight.shape[0])}"
        )
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    fast = triton_enabled(x, weight) and x.dtype in _DTYPES and weight.dtype == x.dtype
    if (
        0 < rows <= GEMV_MAX_ROWS
        and fast
        and weight.stride(-1) == 1
        and (residual is None or residual.is_contiguous())
    ):
        plan = gemv_plan(*weight.shape)
        if plan is not None and rows <= plan.get("max_rows", GEMV_MAX_ROWS):
            from hyserve.kernels.linear.triton_kernel import gemv_triton

            x2 = x.reshape(rows, x.shape[-1])
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            r2 = residual.view(rows, weight.shape[0]) if residual is not None else None
            y = gemv_triton(x2, weight, plan, norm_weight=norm_weight, norm_eps=norm_eps, residual=r2)
            return residual if residual is not None else y.reshape(*x.shape[:-1], weight.shape[0])
    if not fast:
        return linear_reference(x, weight, norm_weight=norm_weight, norm_eps=norm_eps, residual=residual)
    if norm_weight is not None:  # the Triton norm, then cuBLAS, whose epilogue adds the residual
        x = rms_norm(x, norm_weight, norm_eps)
    if residual is None or not residual.is_contiguous():
        return linear_reference(x, weight, residual=residual)
    residual.view(-1, weight.shape[0]).addmm_(x.reshape(-1, x.shape[-1]), weight.t())
    return residual


__all__ = ["GEMV_MAX_ROWS", "gemv_plan", "linear", "linear_reference"]
