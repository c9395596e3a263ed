from __future__ import annotations

import torch

from hyserve.kernels.causal_conv1d.reference import causal_conv1d_decode_reference
from hyserve.kernels.gated_delta_rule.reference import gated_delta_rule_decode_reference
from hyserve.kernels.gated_rmsnorm.reference import gated_rms_norm_reference
from hyserve.kernels.gdn_gating.reference import gdn_gating_reference


def gdn_decode_step_reference(
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
    """The decode branch of ``GatedDeltaNet.forward`` from the projections to the gated norm.

    mixed_qkv: [B, 2*H*K + HV*V] (in_proj_qkv output, model dtype); z: [B, HV, V]; a, b: [B, HV];
    conv_weight: [D, W]; A_log, dt_bias: [HV]; norm_weight: [V]; conv_state: [S, W-1, D] and
    ssm_state: [S, HV, K, V] fp32, both updated in place at ``state_indices`` [B].
    Returns o: [B, HV, V] in mixed_qkv's dtype (after the gated RMSNorm, before out_proj).
    """
    batch = mixed_qkv.shape[0]
    num_v_heads, head_k, head_v = ssm_state.shape[1:]
    key_dim = (mixed_qkv.shape[1] - num_v_heads * head_v) // 2
    x = causal_conv1d_decode_reference(mixed_qkv, conv_weight, conv_state, state_indices)
    q, k, v = x.split([key_dim, key_dim, num_v_heads * head_v], dim=-1)
    q = q.reshape(batch, key_dim // head_k, head_k)
    k = k.reshape(batch, key_dim // head_k, head_k)
    v = v.reshape(batch, num_v_heads, head_v)
    g, beta = gdn_gating_reference(a, b, A_log, dt_bias)
    o = gated_delta_rule_decode_reference(q, k, v, g, beta, ssm_state, state_indices)
    return gated_rms_norm_reference(o, z, norm_weight, eps)
