"""The plain-torch copy that ``copy_words`` replaces."""

from __future__ import annotations

import torch


def copy_words_reference(src: torch.Tensor, dst: torch.Tensor, overlay: torch.Tensor | None = None) -> None:
    """src, dst, overlay: int32 words [S], [>= S], [M <= S]: dst[:S] = src, then dst[:M] = overlay."""
    dst[: src.numel()].copy_(src)
    if overlay is not None:
        dst[: overlay.numel()].copy_(overlay)
