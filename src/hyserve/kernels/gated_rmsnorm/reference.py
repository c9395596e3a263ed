from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_rms_norm_reference(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x, gate: [..., D]; weight: [D]. Norm in fp32, cast, scaled by w, then times silu(gate) in fp32."""
    h = x.float()
    h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    out = weight * h
    return (out.float() * F.silu(gate.float())).to(x.dtype)
