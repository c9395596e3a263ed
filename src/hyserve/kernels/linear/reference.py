"""The definition of the op: ``y = [residual +] rms_norm(x) W^T`` (no bias), ``F.linear`` at its core.

The norm (zero-centred RMSNorm, ``rms_norm_reference``) and the residual add are optional: they are the
decoder layer's pre-norm and residual connection, passed to the block's first and last projection so the
fast paths can run them inside the GEMV (``triton_kernel.py``) or cuBLAS's epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hyserve.kernels.gated_rmsnorm.reference import gated_rms_norm_reference
from hyserve.kernels.rmsnorm.reference import rms_norm_reference


@dataclass(frozen=True)
class GatedNorm:
    """The Gated DeltaNet output norm as a projection's input norm: per group of ``weight.numel()`` columns of
    x, ``weight * rms_norm(x) * silu(gate)`` (``gated_rms_norm_reference``: a plain weight, not 1 + w)."""

    weight: torch.Tensor  # [G] the norm weight of one group (a head)
    gate: torch.Tensor  # [..., K] z, x's shape (K a multiple of G)
    eps: float


def linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated_norm: GatedNorm | None = None,
) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N] in x's dtype (fp32 accumulation on CUDA, as cuBLAS does).

    norm_weight [K]: x is first ``rms_norm_reference(x, norm_weight, norm_eps)`` (rounded to x's dtype).
    residual [..., N]: the result is added to it in place (in its dtype) and the residual is returned.
    gated_norm (instead of norm_weight): x is first its gated norm, per group of columns (rounded to x's dtype)."""
    if norm_weight is not None:
        x = rms_norm_reference(x, norm_weight, norm_eps)
    if gated_norm is not None:
        g = gated_norm.weight.shape[0]
        grouped = (*x.shape[:-1], x.shape[-1] // g, g)
        x = gated_rms_norm_reference(
            x.reshape(grouped), gated_norm.gate.reshape(grouped), gated_norm.weight, gated_norm.eps
        ).reshape(x.shape)
    y = F.linear(x, weight)
    return y if residual is None else residual.add_(y)
