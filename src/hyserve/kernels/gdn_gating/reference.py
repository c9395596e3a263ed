"""The Gated DeltaNet gates of a prefill, in plain PyTorch (the model card's formulas).

a, b [T, HV] (model dtype; views of in_proj's output), A_log, dt_bias [HV]:
``g = -exp(A_log) * softplus(a + dt_bias)`` [T, HV] fp32 (the per-head log-decay, <= 0) and
``beta = sigmoid(b)`` [T, HV] in b's dtype (the write strength).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_gating_reference(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (g [T, HV] fp32, beta [T, HV] b.dtype)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid()
