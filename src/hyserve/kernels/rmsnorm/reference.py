from __future__ import annotations

import torch


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Zero-centred RMSNorm over the last dim, computed in fp32 and cast after the multiply.

    x: [..., D]; weight: [D] (applied as 1 + weight). With ``residual`` ([..., D]) the input is
    ``h = x + residual`` (added in x's dtype, as the decoder layer does) and ``(norm(h), h)`` is returned.
    """
    if residual is not None:
        x = x + residual
    h = x.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    out = out.to(x.dtype)
    return out if residual is None else (out, x)
