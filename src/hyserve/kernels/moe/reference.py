from __future__ import annotations

import torch
import torch.nn.functional as F

from hyserve.kernels.activation.reference import silu_and_mul_reference
from hyserve.kernels.rmsnorm.reference import rms_norm_reference


def route_reference(
    x: torch.Tensor, gate_weight: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, H]; gate_weight: [E, H]. Softmax over all E in fp32, then top-k, renormalised.

    Returns (weights [T, k] in x's dtype, expert ids [T, k] int64)."""
    logits = F.linear(x, gate_weight)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(x.dtype), ids


def fused_moe_reference(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
    shared_gate_up: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
    shared_expert_gate: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
    routing: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """x: [T, H] -> [T, H]. Each expert runs on the tokens routed to it (in x's dtype); the weighted
    sum over experts accumulates in fp32. With ``norm_weight`` the block's input is
    ``rms_norm_reference(x, norm_weight, norm_eps)`` (the decoder layer's pre-norm); with ``residual``
    ([T, H]) the output is added to it in place (in its dtype) and the residual is returned. ``routing``
    (topk_ids [T, k], their raw logits [T, k] fp32 before the pre-norm's rstd) replaces the router: the weights
    are the softmax of ``rstd * raw`` rounded through x's dtype, as the router's logits are."""
    if routing is not None:
        ids, raw = routing
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm_eps)
        weights = torch.softmax((raw * rstd).to(x.dtype).float(), dim=-1).to(x.dtype)
        ids = ids.long()
    if norm_weight is not None:
        x = rms_norm_reference(x, norm_weight, norm_eps)
    if routing is None:
        weights, ids = route_reference(x, gate_weight, top_k)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in ids.unique().tolist():
        token, slot = torch.where(ids == expert)
        h = silu_and_mul_reference(F.linear(x[token], w_gate_up[expert]))
        y = F.linear(h, w_down[expert]) * weights[token, slot, None]
        out.index_add_(0, token, y.float())
    if shared_gate_up is not None:
        shared = F.linear(silu_and_mul_reference(F.linear(x, shared_gate_up)), shared_down)
        if shared_expert_gate is not None:
            shared = torch.sigmoid(F.linear(x, shared_expert_gate)) * shared
        out += shared.float()
    return out.to(x.dtype) if residual is None else residual.add_(out.to(x.dtype))
