"""Reference: the MoE router's logits carried by the mixer's projections, in plain torch (the definitions the
Triton path implements; ``__init__.py`` says why).

A decoder layer computes ``h1 = h0 + W_o a`` (the mixer's out-projection with its residual add), then routes
``xn = rms_norm(h1) = h1 rstd(h1) (1 + g)``: ``logits = W_r xn``. Since ``W_r xn = rstd(h1) (W_r' h0 + M a)``
with ``W_r' = W_r diag(1 + g)`` and ``M = W_r' W_o``, the in-projection (whose input is h0) can compute
``W_r' h0`` as extra rows without its norm, and the out-projection (whose input is a) ``M a`` as extra rows. The
top-k of ``rstd * raw`` is the top-k of ``raw`` (rstd > 0), so it needs no h1; the experts then apply the norm
and the softmax of the top-k's scaled logits (``moe`` with ``routing``). The logits differ from ``W_r bf16(xn)``
by roundings (h1 and xn not rounded before the product, M rounded to the weights' dtype) of the order of the
logits' own rounding to it, and experts whose logits tie after that rounding may come in another order.
"""

from __future__ import annotations

import torch

from hyserve.kernels.linear.reference import linear_reference
from hyserve.kernels.moe.reference import route_reference


@torch.no_grad()
def build_router_rows(
    router_weight: torch.Tensor, norm_weight: torch.Tensor, out_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_weight W_r [E, H], the router's pre-norm weight g [H] (zero-centred: 1 + g), the mixer's
    out-projection W_o [H, Hv] -> (``W_r'`` [E, H], ``M = W_r' W_o`` [E, Hv]), fp32 products rounded once to
    W_r's dtype."""
    wr = router_weight.float() * (1.0 + norm_weight.float())[None, :]
    return wr.to(router_weight.dtype), (wr @ out_weight.float()).to(router_weight.dtype)


def project_in_reference(
    x: torch.Tensor, weight: torch.Tensor, n: int, norm_weight: torch.Tensor, norm_eps: float
) -> torch.Tensor:
    """x h0 [T, H], weight [n + E, H] (the in-projection's n rows, then ``W_r'``) -> [T, n + E]: the first n
    columns ``rms_norm(x) W^T`` (the in-projection), the rest ``x W_r'^T`` (no norm), in x's dtype."""
    main = linear_reference(x, weight[:n], norm_weight=norm_weight, norm_eps=norm_eps)
    return torch.cat([main, linear_reference(x, weight[n:])], dim=-1)


def project_out_route_reference(
    a: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, partial: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """a [T, Hv], weight [E + H, Hv] (M's E rows, then W_o), residual h0 [T, H] (updated in place to h1),
    partial ``W_r' h0`` [T, E] (``project_in``'s last columns) -> (topk_ids [T, k] int32, their raw logits
    ``W_r' h0 + M a`` [T, k] fp32, largest first)."""
    num_experts = partial.shape[-1]
    raw = partial.float() + a.float() @ weight[:num_experts].float().t()
    linear_reference(a, weight[num_experts:], residual=residual)  # h1, in place: the residual stream's dtype
    top, ids = torch.topk(raw, top_k, dim=-1)
    return ids.to(torch.int32), top


def router_reference(
    h1: torch.Tensor, router_weight: torch.Tensor, norm_weight: torch.Tensor, norm_eps: float, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the routed projections replace: ``route_reference(rms_norm(h1), W_r)`` -> (ids int32, weights
    fp32), the routing the tests compare them with."""
    from hyserve.kernels.rmsnorm.reference import rms_norm_reference

    weights, ids = route_reference(rms_norm_reference(h1, norm_weight, norm_eps), router_weight, top_k)
    return ids.to(torch.int32), weights.float()
