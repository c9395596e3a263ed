"""Choosing between an op's fast kernel and its reference."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch

_state = threading.local()


def reference_only() -> bool:
    """True when the references are forced (``use_reference()`` or ``HYSERVE_KERNELS=reference``)."""
    return getattr(_state, "force", False) or os.environ.get("HYSERVE_KERNELS") == "reference"


@contextlib.contextmanager
def use_reference(enabled: bool = True) -> Iterator[None]:
    """Run every op through its plain-PyTorch reference inside this block (this thread)."""
    previous = getattr(_state, "force", False)
    _state.force = enabled
    try:
        yield
    finally:
        _state.force = previous


def triton_enabled(*tensors: torch.Tensor) -> bool:
    """Whether a Triton kernel may run on these tensors: CUDA tensors, or the CPU interpreter."""
    if reference_only():
        return False
    if all(t.is_cuda for t in tensors):
        return True
    return os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("HYSERVE_KERNELS") == "triton"
