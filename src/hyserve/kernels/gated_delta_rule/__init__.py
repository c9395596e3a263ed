"""The gated delta rule of Gated DeltaNet, with an fp32 recurrent state per sequence.

Per value head, with q and k L2-normalised inside the op and q scaled by ``K ** -0.5``::

    S_t = exp(g_t) * S_{t-1} + beta_t * k_t (v_t - exp(g_t) * S_{t-1}^T k_t)^T      S: [K, V]
    o_t = S_t^T q_t

Key head ``j`` serves value heads ``j * HV/H .. (j+1) * HV/H - 1``. The state of a sequence lives in
slot ``state_indices[i]`` of a pool ``state [num_slots, HV, K, V]`` (fp32) and is updated in place.
``prefill`` is the chunked form for many tokens per sequence; ``decode`` the recurrent form for one.
Both dispatch to Triton (``triton_prefill.py``: three kernels, no host sync; ``triton_decode.py``: one)
where ``dispatch.triton_enabled`` allows it and the layout is supported, else to the reference.
"""

from __future__ import annotations

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.gated_delta_rule.reference import (
    gated_delta_rule_decode_reference,
    gated_delta_rule_prefill_reference,
)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor) -> bool:
    return (
        q.dtype in _DTYPES
        and k.dtype == q.dtype
        and v.dtype == q.dtype
        and state.dtype == torch.float32
        and state.is_contiguous()
        and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        and q.shape[-1] <= 256
        and v.shape[-1] <= 256
        and v.shape[-2] % q.shape[-2] == 0
    )


def gated_delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Packed sequences, chunked form. See ``gated_delta_rule_prefill_reference`` for the contract."""
    if triton_enabled(q, k, v, g, beta, state, cu_seqlens) and _supported(q, k, v, state):
        from hyserve.kernels.gated_delta_rule.triton_prefill import gated_delta_rule_prefill_triton

        return gated_delta_rule_prefill_triton(
            q, k, v, g, beta, state, cu_seqlens, state_indices, has_initial_state
        )
    return gated_delta_rule_prefill_reference(
        q, k, v, g, beta, state, cu_seqlens, state_indices, has_initial_state
    )


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence, recurrent form. See ``gated_delta_rule_decode_reference``."""
    if triton_enabled(q, k, v, g, beta, state, state_indices) and _supported(q, k, v, state):
        from hyserve.kernels.gated_delta_rule.triton_decode import gated_delta_rule_decode_triton

        return gated_delta_rule_decode_triton(q, k, v, g, beta, state, state_indices)
    return gated_delta_rule_decode_reference(q, k, v, g, beta, state, state_indices)


__all__ = [
    "gated_delta_rule_decode",
    "gated_delta_rule_decode_reference",
    "gated_delta_rule_prefill",
    "gated_delta_rule_prefill_reference",
]
