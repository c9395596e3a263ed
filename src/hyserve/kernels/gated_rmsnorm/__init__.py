"""The Gated DeltaNet output norm: ``w * rmsnorm(o) * silu(z)`` per head (plain ``w``, not ``1 + w``).

Triton (``triton_kernel.py``) for fp16/bf16/fp32 x and gate of one shape; else the reference.
"""

from __future__ import annotations

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.gated_rmsnorm.reference import gated_rms_norm_reference

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """See ``gated_rms_norm_reference``: x, gate [..., D]; weight [D]."""
    if (
        triton_enabled(x, gate, weight)
        and x.dtype in _DTYPES
        and gate.shape == x.shape
        and weight.shape == (x.shape[-1],)
        and torch.result_type(weight, x) in (x.dtype, torch.float32)
    ):
        from hyserve.kernels.gated_rmsnorm.triton_kernel import gated_rms_norm_triton

        return gated_rms_norm_triton(x, gate, weight, eps)
    return gated_rms_norm_reference(x, gate, weight, eps)


__all__ = ["gated_rms_norm", "gated_rms_norm_reference"]
