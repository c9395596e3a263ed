"""The definition of the op: ``y = [residual +] rms_norm(x) W^T`` (no bias), ``F.linear`` at its core.

The norm (zero-centred RMSNorm, ``rms_norm_reference``) and the residual add are optional: they are the
decoder layer's pre-norm and residual connection, passed to the block's first and last projection so the
fast paths can run them inside the GEMV (``triton_kernel.py``) or cuBLAS's epilogue.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyserve.kernels.rmsnorm.reference import rms_norm_reference


def linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N] in x's dtype (fp32 accumulation on CUDA, as cuBLAS does).

    norm_weight [K]: x is first ``rms_norm_reference(x, norm_weight, norm_eps)`` (rounded to x's dtype).
    residual [..., N]: the result is added to it in place (in its dtype) and the residual is returned."""
    if norm_weight is not None:
        x = rms_norm_reference(x, norm_weight, norm_eps)
    y = F.linear(x, weight)
    return y if residual is None else residual.add_(y)
