"""SwiGLU activation ``silu(gate) * up`` over a fused [gate | up] projection.

Triton (``triton_kernel.py``) for fp16/bf16/fp32 with an even last dim; else the reference.
"""

from __future__ import annotations

import torch

from hyserve.kernels.activation.reference import silu_and_mul_reference
from hyserve.kernels.dispatch import triton_enabled

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """See ``silu_and_mul_reference``: [..., 2I] -> [..., I]."""
    if triton_enabled(x) and x.dtype in _DTYPES and x.shape[-1] % 2 == 0:
        from hyserve.kernels.activation.triton_kernel import silu_and_mul_triton

        return silu_and_mul_triton(x)
    return silu_and_mul_reference(x)


__all__ = ["silu_and_mul", "silu_and_mul_reference"]
