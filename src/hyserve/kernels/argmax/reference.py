"""Reference: the LM head's logits in fp32 and their greedy token, as two torch ops."""

from __future__ import annotations

import torch


def logits_argmax_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, V] logits in the LM head's dtype -> (x as fp32 [N, V], the index of each row's first maximum
    [N] int64; NaN counts as the maximum, as in ``torch.argmax``)."""
    logits = x.float()
    return logits, logits.argmax(-1)
