"""``y = [residual +] rms_norm(x) W^T`` without bias: the model's projections and LM head.

Few rows (decode at small batch, x [M <= 4, K]) go to the Triton GEMV (``triton_kernel.py``) where
``configs/gemv.json`` has a plan for the weight's (N, K) and that plan is not ``"cublas"``; everything
else (prefill, bigger batches, shapes the sweep found cuBLAS faster on) goes to cuBLAS, after the
Triton ``rms_norm`` when there is a norm, with the residual added in cuBLAS's epilogue (``addmm_``). The JSON is
written by ``python -m hyserve.kernels.linear.bench --write`` on the GPU.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.gated_rmsnorm import gated_rms_norm
from hyserve.kernels.linear.reference import GatedNorm, linear_reference
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
    gated_norm: GatedNorm | None = None,
) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N]: ``[residual +] rms_norm(x) W^T``, or with ``gated_norm``
    ``[residual +] gated_norm(x) W^T`` (the contract of ``linear_reference``; with a residual, it is updated
    in place and returned)."""
    if residual is not None and residual.shape != (*x.shape[:-1], weight.shape[0]):
        raise ValueError(
            f"residual {tuple(residual.shape)} does not match the output {(*x.shape[:-1], weight.shape[0])}"
        )
    if gated_norm is not None and norm_weight is not None:
        raise ValueError("linear takes a pre-norm or a gated norm, not both")
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    fast = triton_enabled(x, weight) and x.dtype in _DTYPES and weight.dtype == x.dtype
    if (
        0 < rows <= GEMV_MAX_ROWS
        and fast
        and weight.stride(-1) == 1
        and (residual is None or residual.is_contiguous())
        and (gated_norm is None or fuses_gated_norm(rows, weight, gated_norm.weight.shape[0]))
    ):
        plan = gemv_plan(*weight.shape)
        if plan is not None:
            from hyserve.kernels.linear.triton_kernel import gemv_triton

            x2 = x.reshape(rows, x.shape[-1])
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            r2 = residual.view(rows, weight.shape[0]) if residual is not None else None
            if gated_norm is not None:
                gate = gated_norm.gate.reshape(rows, x.shape[-1])
                gated_norm = GatedNorm(gated_norm.weight, gate if gate.stride(-1) == 1 else gate.contiguous(),
                                       gated_norm.eps)  # fmt: skip
            y = gemv_triton(
                x2,
                weight,
                plan,
                norm_weight=norm_weight,
                norm_eps=norm_eps,
                residual=r2,
                gated_norm=gated_norm,
            )
            return residual if residual is not None else y.reshape(*x.shape[:-1], weight.shape[0])
    if not fast:
        return linear_reference(
            x, weight, norm_weight=norm_weight, norm_eps=norm_eps, residual=residual, gated_norm=gated_norm
        )
    if norm_weight is not None:  # the Triton norm, then cuBLAS, whose epilogue adds the residual
        x = rms_norm(x, norm_weight, norm_eps)
    if gated_norm is not None:  # the Triton gated norm over [..., K / G, G] groups, then cuBLAS
        g = gated_norm.weight.shape[0]
        grouped = (*x.shape[:-1], x.shape[-1] // g, g)
        x = gated_rms_norm(
            x.reshape(grouped), gated_norm.gate.reshape(grouped), gated_norm.weight, gated_norm.eps
        )
        x = x.reshape(*grouped[:-2], -1)
    if residual is None or not residual.is_contiguous():
        return linear_reference(x, weight, residual=residual)
    residual.view(-1, weight.shape[0]).addmm_(x.reshape(-1, x.shape[-1]), weight.t())
    return residual


def fuses_gated_norm(rows: int, weight: torch.Tensor, group: int) -> bool:
    """Whether ``linear`` of x [rows, K] by ``weight`` runs a gated norm of ``group``-column groups inside its
    GEMV (Triton on, few rows, a GEMV plan whose K tile holds whole groups), rather than as a kernel of its own."""
    if not (0 < rows <= GEMV_MAX_ROWS and triton_enabled(weight) and weight.dtype in _DTYPES):
        return False
    plan = gemv_plan(*weight.shape)
    if plan is None:
        return False
    from hyserve.kernels.linear.triton_kernel import gemv_takes_gated_norm

    return gemv_takes_gated_norm(plan, rows, weight.shape[1], group)


__all__ = ["GEMV_MAX_ROWS", "GatedNorm", "fuses_gated_norm", "gemv_plan", "linear", "linear_reference"]
