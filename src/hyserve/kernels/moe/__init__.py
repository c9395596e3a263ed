"""The sparse MoE block: fp32 softmax router, top-k, renormalise, SwiGLU experts, sigmoid-gated shared expert.

Expert weights are stacked: ``w_gate_up [E, 2I, H]`` (rows 0..I-1 gate, I..2I-1 up) and
``w_down [E, H, I]``; the shared expert is ``shared_gate_up [2Is, H]``, ``shared_down [H, Is]`` with its
scalar gate ``shared_expert_gate [1, H]``.

``fused_moe`` runs the Triton pipeline (``triton_moe.fused_moe_triton``: routing + grouping kernel,
grouped gate_up with SwiGLU, down projection with the weighted sum; decode and prefill variants picked
by T, tile plans in ``configs/``) when ``dispatch.triton_enabled`` allows it, else the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.moe.reference import fused_moe_reference, route_reference

if TYPE_CHECKING:
    from hyserve.kernels.moe.mma_experts import MmaExperts

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def fused_moe(
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
    packed: MmaExperts | None = None,
) -> torch.Tensor:
    """x: [..., H] -> [..., H] in x's dtype (the contract of ``fused_moe_reference``: the block's pre-norm
    and, with a residual, the residual add in place, the residual returned). ``routing`` (topk_ids [T, k] int32, their raw
    logits [T, k] fp32 before the pre-norm's rstd): taken by ``kernels/routed_projection``; no router runs.
    ``packed``: the experts' 12-bit copies (``mma_experts.pack_mma_experts``), streamed instead where their
    kernels take the call."""
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} must have x's shape {tuple(x.shape)}")
    weights = (gate_weight, w_gate_up, w_down, top_k, shared_gate_up, shared_down, shared_expert_gate)
    released = packed is not None and packed.released  # only the 12-bit copies are left (--mma-experts-only)
    if released and not (
        x.is_cuda and triton_enabled(x, gate_weight) and (residual is None or residual.is_contiguous())
    ):
        raise ValueError(
            "this MoE block's bf16 experts were released (--mma-experts-only): it runs only on the CUDA kernels "
            f"over their 12-bit copies, not on {x.device} or the reference path"
        )
    if released or (
        triton_enabled(x, gate_weight, w_gate_up, w_down)
        and (residual is None or residual.is_contiguous())
        and x.dtype in _DTYPES
        and w_gate_up.dtype == x.dtype
        and w_down.dtype == x.dtype
        and w_gate_up.stride(-1) == 1
        and w_down.stride(-1) == 1
    ):
        from hyserve.kernels.moe.triton_moe import fused_moe_triton

        shape = x.shape
        out = fused_moe_triton(
            x.reshape(-1, shape[-1]),
            *weights,
            norm_weight=norm_weight,
            norm_eps=norm_eps,
            residual=residual.view(-1, shape[-1]) if residual is not None else None,
            routing=routing,
            packed=packed,
        )
        return residual if residual is not None else out.reshape(shape)
    return fused_moe_reference(
        x, *weights, norm_weight=norm_weight, norm_eps=norm_eps, residual=residual, routing=routing
    )


__all__ = ["fused_moe", "fused_moe_reference", "route_reference"]
