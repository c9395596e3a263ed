from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., H, K] -> fp32 [..., HV, K]: L2-normalised, q scaled, key heads repeated for their value heads."""
    group = num_v_heads // q.shape[-2]
    q = l2norm(q.float()) * q.shape[-1] ** -0.5
    k = l2norm(k.float())
    return q.repeat_interleave(group, dim=-2), k.repeat_interleave(group, dim=-2)


def _chunked_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence. q, k: [HV, L, K]; v: [HV, L, V]; g, beta: [HV, L]; state: [HV, K, V]; all fp32."""
    length = q.shape[1]
    pad = (-length) % CHUNK
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    n_chunks = (length + pad) // CHUNK
    heads = q.shape[0]
    q, k, v = (t.view(heads, n_chunks, CHUNK, -1) for t in (q, k, v))
    g, beta = (t.view(heads, n_chunks, CHUNK) for t in (g, beta))

    cum = g.cumsum(-1)  # [HV, n, C]: log of the decay from the chunk start to each position
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [HV, n, C, C]
    k_beta = k * beta[..., None]
    # (I + strictly-lower(k_beta k^T * decay)) u = v * beta, and the same system for the decayed keys
    system = (k_beta @ k.transpose(-1, -2)) * decay
    system = system.tril(-1) + torch.eye(CHUNK, device=q.device)
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay  # [HV, n, C, C], diagonal included
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    out = torch.empty_like(v)
    for c in range(n_chunks):
        v_new = u[:, c] - w[:, c] @ state
        out[:, c] = q_decayed[:, c] @ state + intra[:, c] @ v_new
        state = state * cum[:, c, -1].exp()[:, None, None] + k_to_end[:, c].transpose(-1, -2) @ v_new
    return out.view(heads, n_chunks * CHUNK, -1)[:, :length], state


def gated_delta_rule_prefill_reference(
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
    """Packed sequences, chunked form (chunk 64, fp32).

    q, k: [T, H, K]; v: [T, HV, V]; g (log-decay, <= 0), beta: [T, HV]; state: [S, HV, K, V] fp32;
    cu_seqlens: [N+1]; state_indices: [N]; has_initial_state: [N] bool (False: start from zeros).
    Returns o: [T, HV, V] in v's dtype; writes each sequence's final state into its slot.
    """
    num_v_heads = v.shape[1]
    qf, kf = _prepare(q, k, num_v_heads)
    out = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_indices.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if end == start:
            continue
        initial = state[slot].float() if bool(has_initial_state[i]) else state.new_zeros(state.shape[1:])
        o, final = _chunked_one(
            qf[start:end].transpose(0, 1),
            kf[start:end].transpose(0, 1),
            v[start:end].float().transpose(0, 1),
            g[start:end].float().t(),
            beta[start:end].float().t(),
            initial.float(),
        )
        out[start:end] = o.transpose(0, 1).to(v.dtype)
        state[slot] = final.to(state.dtype)
    return out


def gated_delta_rule_decode_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence, recurrent form. q, k: [B, H, K]; v: [B, HV, V]; g, beta: [B, HV];
    state: [S, HV, K, V] fp32 (rows ``state_indices`` [B] read and updated). Returns o: [B, HV, V]."""
    qf, kf = _prepare(q, k, v.shape[1])
    s = state[state_indices].float() * g.float().exp()[..., None, None]  # [B, HV, K, V]
    predicted = (s * kf[..., None]).sum(-2)  # S^T k: [B, HV, V]
    delta = (v.float() - predicted) * beta.float()[..., None]
    s = s + kf[..., None] * delta[..., None, :]
    state[state_indices] = s.to(state.dtype)
    return (s * qf[..., None]).sum(-2).to(v.dtype)
