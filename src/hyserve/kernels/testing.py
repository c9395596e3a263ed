"""What the kernel tests and GPU checks share: the relative error they compare a fast path with its reference by."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 over all elements, b the reference (moved to a's device); 0 when both are 0."""
    a = a.double()
    b = b.double().to(a.device)
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
