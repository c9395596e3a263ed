"""Reference: what ``gemv_mma`` computes, in plain torch on the unpacked weight.

``y = x_n W^T`` for one row x [1, K] and W [N, K] (the packed copy's exact bf16 values), where the rows below
``raw_from`` take ``x_n = rms_norm(x)`` rounded to x's dtype (the model's pre-norm, as the unfused path rounds
it) and the rows from ``raw_from`` on take x as it is (the router's rows of a routed in-projection, which have
the norm weight folded in; ``kernels/routed_projection``). Without a norm weight every row takes x.
"""

from __future__ import annotations

import torch

from hyserve.kernels.linear.reference import linear_reference
from hyserve.kernels.mma_gemv.layout import MmaPackedBF16, unpack_mma


def gemv_mma_reference(
    x: torch.Tensor,
    packed: MmaPackedBF16,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    raw_from: int | None = None,
) -> torch.Tensor:
    """x [1, K] -> [1, N] in x's dtype (the contract of ``gemv_mma``)."""
    w = unpack_mma(packed).to(x.device)
    if norm_weight is None:
        return linear_reference(x, w)
    split = w.shape[0] if raw_from is None else raw_from
    normed = linear_reference(x, w[:split], norm_weight=norm_weight, norm_eps=norm_eps)
    return torch.cat([normed, linear_reference(x, w[split:])], dim=-1)
