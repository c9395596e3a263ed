"""The Gated DeltaNet prefill gates: ``g = -exp(A_log) * softplus(a + dt_bias)`` (fp32) and ``beta = sigmoid(b)``.

Triton (``triton_kernel.py``, one launch) for fp16/bf16/fp32 a and b with unit head stride; else the
reference. The decode step computes the same gates inside ``gdn_decode_step``.
"""

from __future__ import annotations

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.gdn_gating.reference import gdn_gating_reference

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def triton_supported(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> bool:
    """Whether the Triton gates (this op's kernel, or the conv kernel's gates column) take these inputs."""
    return (
        triton_enabled(a, b, A_log, dt_bias)
        and a.dtype in _DTYPES
        and b.dtype in _DTYPES
        and a.stride(1) == 1
        and b.stride(1) == 1
        and A_log.is_contiguous()
        and dt_bias.is_contiguous()
    )


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``gdn_gating_reference``: a, b [T, HV], A_log, dt_bias [HV] -> (g [T, HV] fp32, beta [T, HV])."""
    if triton_supported(a, b, A_log, dt_bias):
        from hyserve.kernels.gdn_gating.triton_kernel import gdn_gating_triton

        return gdn_gating_triton(a, b, A_log, dt_bias)
    return gdn_gating_reference(a, b, A_log, dt_bias)


__all__ = ["gdn_gating", "gdn_gating_reference", "triton_supported"]
