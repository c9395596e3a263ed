from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_prefill_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Varlen causal conv over packed sequences; SiLU applied; updates the conv states in place.

    x: [T, D] packed tokens of N sequences; weight: [D, W]; conv_state: [S, W-1, D];
    cu_seqlens: [N+1] int; state_indices: [N] int (slot of each sequence); has_initial_state: [N] bool
    (False: the sequence starts here, its history is zeros). Returns [T, D] in x's dtype.
    """
    width = weight.shape[1]
    out = torch.empty_like(x)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_indices.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if end == start:
            continue
        if bool(has_initial_state[i]):
            history = conv_state[slot].to(x.dtype)
        else:
            history = x.new_zeros(width - 1, x.shape[1])
        seq = torch.cat([history, x[start:end]], dim=0)  # [W-1+L, D]
        y = F.conv1d(seq.t().unsqueeze(0).float(), weight.float().unsqueeze(1), groups=x.shape[1])
        out[start:end] = F.silu(y[0].t()).to(x.dtype)
        conv_state[slot] = seq[-(width - 1) :].to(conv_state.dtype)
    return out


def causal_conv1d_decode_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    state_indices: torch.Tensor,
) -> torch.Tensor:
    """One new token per sequence. x: [B, D]; weight: [D, W]; conv_state: [S, W-1, D] updated in place."""
    history = conv_state[state_indices].to(x.dtype)  # [B, W-1, D]
    window = torch.cat([history, x[:, None, :]], dim=1)  # [B, W, D]
    y = (window.float() * weight.float().t()[None]).sum(1)
    conv_state[state_indices] = window[:, 1:].to(conv_state.dtype)
    return F.silu(y).to(x.dtype)
