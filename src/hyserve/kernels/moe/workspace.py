"""Workspace allocation for the Triton MoE path; tests set ``POISON`` so stale reads show up."""

from __future__ import annotations

import torch

POISON = False  # fill new buffers with NaN (floats) / a huge id (ints) instead of leaving them empty


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    if POISON:
        t.fill_(float("nan") if dtype.is_floating_point else 1 << 30)
    return t
