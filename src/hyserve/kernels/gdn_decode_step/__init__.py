"""One Gated DeltaNet decode step after the input projections, fused: conv1d + SiLU, gating, the
recurrent delta rule and the gated RMSNorm (one Triton launch per layer).

``gdn_decode_step(mixed_qkv, z, a, b, conv_weight, A_log, dt_bias, norm_weight, eps, conv_state,
ssm_state, state_indices) -> o [B, HV, V]`` equals, for one new token per sequence::

    x = causal_conv1d_decode(mixed_qkv, conv_weight, conv_state, state_indices)   # SiLU, state shifted
    q, k, v = split(x);  beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
    o = gated_delta_rule_decode(q, k, v, g, beta, ssm_state, state_indices)
    o = gated_rms_norm(o, z, norm_weight, eps)

H = (D - HV*V) / (2K) with HV, K, V from ``ssm_state`` [S, HV, K, V]. Both state pools are updated in place.
"""

from __future__ import annotations

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.gdn_decode_step.reference import gdn_decode_step_reference

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _supported(
    mixed_qkv: torch.Tensor, z: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> bool:
    num_v_heads, head_k, head_v = ssm_state.shape[1:]
    key_dim2 = mixed_qkv.shape[1] - num_v_heads * head_v
    return (
        mixed_qkv.dtype in _DTYPES
        and mixed_qkv.stride(-1) == 1
        and z.stride(-1) == 1
        and conv_state.is_contiguous()
        and ssm_state.is_contiguous()
        and ssm_state.dtype == torch.float32
        and key_dim2 > 0
        and key_dim2 % (2 * head_k) == 0
        and num_v_heads % (key_dim2 // (2 * head_k)) == 0
        and head_k <= 256
        and head_v <= 256
    )


def gdn_decode_step(
    mixed_qkv: torch.Tensor,
    z: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    state_indices: torch.Tensor,
) -> torch.Tensor:
    """See the module docstring and ``gdn_decode_step_reference`` for shapes."""
    args = (
        mixed_qkv,
        z,
        a,
        b,
        conv_weight,
        A_log,
        dt_bias,
        norm_weight,
        eps,
        conv_state,
        ssm_state,
        state_indices,
    )
    if triton_enabled(mixed_qkv, z, conv_state, ssm_state, state_indices) and _supported(
        mixed_qkv, z, conv_state, ssm_state
    ):
        from hyserve.kernels.gdn_decode_step.triton_kernel import gdn_decode_step_triton

        return gdn_decode_step_triton(*args)
    return gdn_decode_step_reference(*args)


__all__ = ["gdn_decode_step", "gdn_decode_step_reference"]
