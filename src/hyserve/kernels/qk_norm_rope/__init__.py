"""Per-head q/k RMSNorm (zero-centred) followed by partial NeoX rotary on the first ``rotary_dim`` dims.

Triton (``triton_kernel.py``, one kernel for both, reading q/k as strided views) for fp16/bf16/fp32 with
an even rotary_dim <= head_dim; else the reference.
"""

from __future__ import annotations

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.qk_norm_rope.reference import qk_norm_rope_reference, rope_cos_sin

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    rotary_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``qk_norm_rope_reference``: q [T, Hq, D], k [T, Hk, D], the cos/sin tables read at ``positions``
    [T] -> new (q, k)."""
    if (
        triton_enabled(q, k, q_weight, k_weight, cos, sin, positions)
        and q.dtype in _DTYPES
        and k.dtype == q.dtype
        and q.shape[2] == k.shape[2]
        and 0 < rotary_dim <= q.shape[2]
        and rotary_dim % 2 == 0
    ):
        from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_triton

        return qk_norm_rope_triton(q, k, q_weight, k_weight, eps, cos, sin, positions, rotary_dim)
    return qk_norm_rope_reference(q, k, q_weight, k_weight, eps, cos, sin, positions, rotary_dim)


__all__ = ["qk_norm_rope", "qk_norm_rope_reference", "rope_cos_sin"]
