"""The gated delta rule of Gated DeltaNet, with an fp32 recurrent state per sequence.

Per value head, with q and k L2-normalised inside the op and q scaled by ``K ** -0.5``::

    S_t = exp(g_t) * S_{t-1} + beta_t * k_t (v_t - exp(g_t) * S_{t-1}^T k_t)^T      S: [K, V]
    o_t = S_t^T q_t

Key head ``j`` serves value heads ``j * HV/H .. (j+1) * HV/H - 1``. The state of a sequence lives in
slot ``state_indices[i]`` of a pool ``state [num_slots, HV, K, V]`` (fp32) and is updated in place.
``prefill`` is the chunked form for many tokens per sequence; ``decode`` the recurrent form for one;
``prefill_conv`` takes the raw projection and applies the Gated DeltaNet's causal conv and gates first (on Triton
the conv can run inside the chunk kernels). They dispatch to Triton (``triton_prefill.py``: two kernels, no host sync; ``triton_decode.py``: one)
where ``dispatch.triton_enabled`` allows it and the layout is supported, else to the reference.
"""

from __future__ import annotations

import torch

from hyserve.kernels.causal_conv1d import causal_conv1d_prefill_gated
from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.gated_delta_rule.reference import (
    gated_delta_rule_decode_reference,
    gated_delta_rule_prefill_reference,
)
from hyserve.kernels.gdn_gating import gdn_gating

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


def gated_delta_rule_prefill_conv(
    mixed_qkv: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    num_k_heads: int,
    head_k_dim: int,
    head_v_dim: int,
) -> torch.Tensor:
    """The Gated DeltaNet prefill from its raw projection: ``causal_conv1d_prefill`` of mixed_qkv
    [T, 2*H*K + HV*V] (weight [D, W] or [D, 1, W], conv_state [S, W-1, D] updated in place), split into
    q [T, H, K], k, v [T, HV, V]; the gates ``gdn_gating(a, b, A_log, dt_bias)``; then ``gated_delta_rule_prefill``
    -> o [T, HV, V]. On Triton either the conv kernel computes the gates beside the conv
    (``causal_conv1d_prefill_gated``) and the chunk kernels read its output, or, with the prefill config's
    ``conv_inside``, the chunk kernels apply the conv to their input tiles themselves (one launch and the conv
    output's round trip fewer; ``gdn_gating`` then runs as its own launch). Both give the same bits."""
    t = mixed_qkv.shape[0]
    key_dim = num_k_heads * head_k_dim
    conv_weight = conv_weight.reshape(mixed_qkv.shape[1], -1)

    def heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = x.split([key_dim, key_dim, x.shape[1] - 2 * key_dim], dim=-1)
        return (
            q.view(t, num_k_heads, head_k_dim),
            k.view(t, num_k_heads, head_k_dim),
            v.view(t, -1, head_v_dim),
        )

    q, k, v = heads(mixed_qkv)
    if (
        triton_enabled(mixed_qkv, conv_weight, conv_state, a, b, state, cu_seqlens)
        and _supported(q, k, v, state)
        and mixed_qkv.stride(1) == 1
        and conv_state.is_contiguous()
        and conv_state.dtype == mixed_qkv.dtype
    ):
        from hyserve.kernels.gated_delta_rule import triton_prefill

        if triton_prefill.conv_inside():
            g, beta = gdn_gating(a, b, A_log, dt_bias)
            return triton_prefill.gated_delta_rule_prefill_triton(
                q, k, v, g, beta, state, cu_seqlens, state_indices, has_initial_state,
                conv=(mixed_qkv, conv_weight, conv_state),
            )  # fmt: skip
    x, g, beta = causal_conv1d_prefill_gated(
        mixed_qkv, conv_weight, conv_state, cu_seqlens, state_indices, has_initial_state, a, b, A_log, dt_bias
    )
    return gated_delta_rule_prefill(*heads(x), g, beta, state, cu_seqlens, state_indices, has_initial_state)


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
    "gated_delta_rule_prefill_conv",
    "gated_delta_rule_prefill_reference",
]
