"""The kernel wrappers' input contracts. A Triton kernel reads raw pointers, so a wrong layout reads wrong
memory instead of failing: each wrapper checks what its kernel assumes here, as a ``ValueError`` that says
what is required (an ``assert`` would vanish under ``python -O``). The messages are constant strings: the
checks run on every eager call."""

from __future__ import annotations

import torch


def unit_dim_stride(t: torch.Tensor) -> torch.Tensor:
    """t itself if its last dim is contiguous (the kernels take any other stride), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def require(ok: bool, contract: str) -> None:
    """Raise ``ValueError(contract)`` unless ``ok``; ``contract`` says what the kernel requires."""
    if not ok:
        raise ValueError(contract)
