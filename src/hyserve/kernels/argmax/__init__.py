"""The decode step's last op: the LM head's logits upcast to fp32 and each row's argmax (the greedy token).

Triton (``triton_kernel.py``, one launch for both: torch needs a cast and a two-pass argmax, ~11 us at
batch 1 over the 248k-entry vocabulary) for fp16/bf16/fp32 rows; else the reference.
"""

from __future__ import annotations

import torch

from hyserve.kernels.argmax.reference import logits_argmax_reference
from hyserve.kernels.dispatch import triton_enabled

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def logits_argmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``logits_argmax_reference``: x [N, V] -> (fp32 logits [N, V], argmax [N] int64)."""
    if triton_enabled(x) and x.dtype in _DTYPES and x.dim() == 2 and 0 < x.shape[1] < 2**31:
        from hyserve.kernels.argmax.triton_kernel import logits_argmax_triton

        return logits_argmax_triton(x)
    return logits_argmax_reference(x)


__all__ = ["logits_argmax", "logits_argmax_reference"]
