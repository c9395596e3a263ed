"""Causal depthwise conv1d + SiLU over the Gated DeltaNet [q | k | v] channels, with a per-sequence state.

The conv state of a sequence is the last ``W - 1`` inputs it has seen, laid out ``[W - 1, D]`` (oldest
first) in slot ``state_indices[i]`` of a pool ``conv_state [num_slots, W - 1, D]``.
``prefill`` dispatches to the Triton kernel (``triton_kernel.py``, varlen, no host sync) where
``dispatch.triton_enabled`` allows it; ``prefill_gated`` also returns the DeltaNet's gates (``gdn_gating``),
computed by the same launch on Triton; ``decode`` stays the reference (the model's decode path is the
fused ``gdn_decode_step``).
"""

from __future__ import annotations

import torch

from hyserve.kernels.causal_conv1d.reference import (
    causal_conv1d_decode_reference,
    causal_conv1d_prefill_reference,
)
from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.gdn_gating import gdn_gating
from hyserve.kernels.gdn_gating import triton_supported as gates_supported

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _triton_ok(x, weight, conv_state, cu_seqlens, state_indices) -> bool:
    return (
        triton_enabled(x, weight, conv_state, cu_seqlens, state_indices)
        and x.dtype in _DTYPES
        and x.stride(-1) == 1
        and conv_state.is_contiguous()
        and conv_state.dtype == x.dtype
    )


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Varlen causal conv + SiLU, conv states updated in place. See ``causal_conv1d_prefill_reference``."""
    if _triton_ok(x, weight, conv_state, cu_seqlens, state_indices):
        from hyserve.kernels.causal_conv1d.triton_kernel import causal_conv1d_prefill_triton

        return causal_conv1d_prefill_triton(
            x, weight, conv_state, cu_seqlens, state_indices, has_initial_state
        )
    return causal_conv1d_prefill_reference(
        x, weight, conv_state, cu_seqlens, state_indices, has_initial_state
    )


def causal_conv1d_prefill_gated(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``causal_conv1d_prefill`` and ``gdn_gating(a, b, A_log, dt_bias)`` (a, b [T, HV] views of the projection,
    A_log, dt_bias [HV]) -> (out [T, D], g [T, HV] fp32, beta [T, HV]); one launch on Triton. Every token of
    x must belong to a sequence of ``cu_seqlens`` (its last entry is T)."""
    if _triton_ok(x, weight, conv_state, cu_seqlens, state_indices) and gates_supported(a, b, A_log, dt_bias):
        from hyserve.kernels.causal_conv1d.triton_kernel import causal_conv1d_prefill_triton

        return causal_conv1d_prefill_triton(
            x,
            weight,
            conv_state,
            cu_seqlens,
            state_indices,
            has_initial_state,
            gates=(a, b, A_log, dt_bias),
        )
    out = causal_conv1d_prefill(x, weight, conv_state, cu_seqlens, state_indices, has_initial_state)
    return (out, *gdn_gating(a, b, A_log, dt_bias))


causal_conv1d_decode = causal_conv1d_decode_reference

__all__ = [
    "causal_conv1d_decode",
    "causal_conv1d_decode_reference",
    "causal_conv1d_prefill",
    "causal_conv1d_prefill_gated",
    "causal_conv1d_prefill_reference",
]
