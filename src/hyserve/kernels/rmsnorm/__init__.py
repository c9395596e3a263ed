"""Zero-centred RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)``, optionally fused with the residual add.

Triton (``triton_kernel.py``) for fp16/bf16/fp32 when x, residual and the output share a dtype; else the
reference.
"""

from __future__ import annotations

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.rmsnorm.reference import rms_norm_reference

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """See ``rms_norm_reference``: the norm, or ``(norm(x + residual), x + residual)``."""
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if (
        triton_enabled(*tensors)
        and x.dtype in _DTYPES
        and (residual is None or residual.dtype == x.dtype)
        and weight.shape == (x.shape[-1],)
    ):
        from hyserve.kernels.rmsnorm.triton_kernel import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_reference(x, weight, eps, residual)


__all__ = ["rms_norm", "rms_norm_reference"]
