from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2I] laid out as [gate (I) | up (I)] -> [..., I], in x's dtype (as HF's MLP computes it)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
