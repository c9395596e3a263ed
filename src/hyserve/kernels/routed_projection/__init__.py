"""The MoE router's logits carried by the mixer's projections, for one decode token (an optional feature).

At batch 1 the router is a kernel of its own between the mixer's out-projection and the experts: ~4.5 us a
layer of dependent latency (a CTA loads h1, reduces its norm, multiplies 1 MB of router weights, then a ticket,
a reload and the top-k), 178 us of the ~2 ms step (docs/performance.md). By linearity (``reference.py``) its
logits split into ``W_r' h0``, computed as 256 extra rows without the norm by the in-projection (in_proj or
qkv, whose input is h0), and ``M a``, 256 extra rows of the out-projection (out_proj or o_proj, whose input is
a), whose first programs take the top-k while W_o's rows stream (``triton_kernel.py``), and the experts'
gate_up applies the pre-norm and the weights' softmax itself. The router launch is gone.

Ops: ``build_router_rows`` (at load), ``project_in`` and ``project_out_route``: the Triton GEMV and
``triton_kernel.py`` for one token where the GEMV plans of both projections exist, else the references.
"""

from __future__ import annotations

import torch

from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.linear import gemv_plan  # a module global: tests patch it
from hyserve.kernels.mma_gemv import MmaPackedBF16, gemv_mma, mma_plan
from hyserve.kernels.routed_projection.reference import (
    build_router_rows,
    project_in_reference,
    project_out_route_reference,
    router_reference,
)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def plans(n_in: int, k_in: int, n_out: int, k_out: int, num_experts: int) -> tuple[dict, dict] | None:
    """The GEMV plans of the in-projection [n_in, k_in] and the out-projection [n_out, k_out] with the router's
    rows, if both exist and their row blocks divide the extra rows (else None: the feature stays off). Each is
    the GEMV table's entry for the extended shape ([n + E, k]: its grid has E / BLOCK_N more programs, which can
    cost the kernel a partial second wave where the plain one fits one), else the plain shape's."""
    p_in = gemv_plan(n_in + num_experts, k_in) or gemv_plan(n_in, k_in)
    p_out = gemv_plan(n_out + num_experts, k_out) or gemv_plan(n_out, k_out)
    if p_in is None or p_out is None:
        return None
    if n_in % p_in["BLOCK_N"] or n_out % p_out["BLOCK_N"] or num_experts % p_out["BLOCK_N"]:
        return None
    return p_in, p_out


def fast(x: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """Whether one token x takes the Triton path (the same answer for every op of a layer's forward)."""
    return x.shape[0] == 1 and x.dtype in _DTYPES and triton_enabled(x, *tensors)


def project_in(
    x: torch.Tensor,
    weight: torch.Tensor,
    n: int,
    norm_weight: torch.Tensor,
    norm_eps: float,
    plan: dict | None,
    mma: MmaPackedBF16 | None = None,
) -> torch.Tensor:
    """See ``project_in_reference``: x h0 [T, H], weight [n + E, H] -> [T, n + E]. ``mma``: the weight's
    fragment-ordered 12-bit copy, streamed by ``kernels/mma_gemv`` where that has a plan (bf16, n in 16-row
    tiles)."""
    if plan is not None and fast(x, weight, norm_weight):
        if (
            mma is not None
            and x.dtype == norm_weight.dtype == torch.bfloat16
            and x.is_contiguous()
            and n % 16 == 0
        ):
            mma_gemv_plan = mma_plan(*weight.shape)
            if mma_gemv_plan is not None:
                return gemv_mma(x, mma, mma_gemv_plan, norm_weight=norm_weight, norm_eps=norm_eps, raw_from=n)
        from hyserve.kernels.linear.triton_kernel import gemv_triton

        return gemv_triton(x, weight, plan, norm_weight=norm_weight, norm_eps=norm_eps, raw_from=n)
    return project_in_reference(x, weight, n, norm_weight, norm_eps)


def project_out_route(
    a: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    partial: torch.Tensor,
    top_k: int,
    plan: dict | None,
    mma: MmaPackedBF16 | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``project_out_route_reference``: a [T, Hv], weight [E + H, Hv], residual [T, H] (updated in place),
    partial [T, E] -> (topk_ids [T, k] int32, their raw logits [T, k] fp32). ``mma``: the weight's
    fragment-ordered 12-bit copy, streamed by ``mma_kernel.py`` where the mma table's plan for the shape has a
    KSPLIT (bf16)."""
    if (
        plan is not None
        and fast(a, weight, residual, partial)
        and a.stride(-1) == 1
        and residual.is_contiguous()
        and partial.stride(-1) == 1
    ):
        mma_route_plan = mma_plan(*weight.shape) if mma is not None else None
        if mma_route_plan is not None and "KSPLIT" in mma_route_plan and a.dtype == torch.bfloat16:
            from hyserve.kernels.routed_projection.mma_kernel import project_out_route_mma

            return project_out_route_mma(a.contiguous(), mma, residual, partial, top_k, mma_route_plan)
        from hyserve.kernels.routed_projection.triton_kernel import project_out_route_triton

        return project_out_route_triton(a, weight, residual, partial, top_k, plan)
    return project_out_route_reference(a, weight, residual, partial, top_k)


__all__ = [
    "build_router_rows",
    "fast",
    "plans",
    "project_in",
    "project_in_reference",
    "project_out_route",
    "project_out_route_reference",
    "router_reference",
]
