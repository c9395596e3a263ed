"""The definition of the op: ``y = x W^T`` (no bias), what ``torch.nn.functional.linear`` computes."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N] in x's dtype (fp32 accumulation on CUDA, as cuBLAS does)."""
    return F.linear(x, weight)
