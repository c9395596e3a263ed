"""The fused MoE block on Triton kernels: same contract as ``fused_moe_reference``.

Pipeline per call (T tokens, k slots, E experts, the shared expert as "expert E"):

1. router logits ``F.linear(x, gate_weight)`` (cuBLAS, like the reference);
2. ``routing.route_and_align``: softmax/top-k/renormalise + expert grouping (one kernel while next_pow2(T) * next_pow2(k) <= 512,
   three above); with ``plan["fused_router"]`` (decode) steps 1-2 are one kernel
   (``route_and_align_fused``: the router GEMV spread over E/BE programs, the last one routes);
3. ``triton_gate_up.gate_up``: h = w * silu(x W_g^T) * (x W_u^T) per routing row;
4. down + weighted sum: ``triton_decode.down_reduce`` (one kernel, T <= 128: each program owns an H
   slice of all tokens and streams every touched expert's down weights once) or
   ``triton_prefill.down_scatter_sum`` (grouped GEMM writing per-pair rows, then a k+1-row sum).

At T <= a few tokens the plan may pick ``"down_mode": "pairs"`` instead (``triton_pairs``: top-k only, then
one gate_up and one down kernel over the (token, expert) pairs, no grouping; with ``"topk_in_experts"`` the
fused router stops at the logits and the two expert kernels take each token's top-k themselves). 3 launches at decode (4
without the fused router), no host syncs (CUDA-graph safe), deterministic (no atomics). The decoder layer's
pre-norm runs inside the fused router on the pairs path (which stores the normed x for the experts), else as
the Triton ``rms_norm`` first; its residual add runs in the down kernel's (or the sum kernel's) epilogue.
Tile plans come from ``configs.get_plan`` (JSON per shape, by token bucket). T above PREFILL_CHUNK runs in chunks to bound
the [T*(k+1), H] intermediate of the prefill path.

The kernels with more than one per-call size argument (token, pair and block counts) do not specialise on
them (``do_not_specialize``): Triton would compile a variant per combination of "divisible by 16" of
those sizes, which a start-up warm-up cannot enumerate, so a serving step with a new token count would
stall on a compilation (seen on the H200: ~2 s in the middle of the c=32 benchmark).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyserve.kernels.activation.reference import silu_and_mul_reference
from hyserve.kernels.moe.configs import get_plan
from hyserve.kernels.moe.mma_experts import MmaExperts
from hyserve.kernels.moe.mma_grouped import down_grouped_mma, gate_up_grouped_mma, grouped_mma_takes
from hyserve.kernels.moe.mma_pairs import (
    down_pairs_mma,
    down_pairs_mma_takes,
    gate_up_pairs_mma,
    gate_up_pairs_mma_takes,
)
from hyserve.kernels.moe.router import route_and_align_fused, route_topk_fused, router_logits_fused
from hyserve.kernels.moe.routing import route_and_align, route_topk, small_routing
from hyserve.kernels.moe.triton_decode import MAX_REDUCE_TOKENS, down_reduce
from hyserve.kernels.moe.triton_gate_up import gate_up
from hyserve.kernels.moe.triton_pairs import down_pairs, gate_up_pairs
from hyserve.kernels.moe.triton_prefill import down_scatter_sum, sum_rows
from hyserve.kernels.rmsnorm import rms_norm

PREFILL_CHUNK = 8192
# the routing block sizes of a block whose bf16 experts were released (``MmaExperts.released``): the plan's,
# clamped into the grouped 12-bit kernels' range (few-token plans' GEMV blocks go to 16, prefills' 128 to 64)
COPIES_BLOCK_MS = (16, 32, 64)


def _copies_plan(plan: dict) -> dict:
    """The grouped plan for a block with only its 12-bit copies: the plan's routing options, its block size clamped
    into ``COPIES_BLOCK_MS``, the scatter down (the grouped 12-bit down's; the Triton configs are not used)."""
    bm = min(max(plan["block_m"], COPIES_BLOCK_MS[0]), COPIES_BLOCK_MS[-1])
    grouped = plan["down_mode"] != "pairs"  # the pairs plans' fused router is the top-k-only kind
    return {
        "block_m": bm,
        "down_mode": "scatter",
        "fused_router": bool(grouped and plan.get("fused_router")),
        "large_routing": plan.get("large_routing", False),
        "atomic_routing": plan.get("atomic_routing", False),
    }


def _one_token_copies_take(packed: MmaExperts, x: torch.Tensor, ids: torch.Tensor) -> bool:
    """Whether both one-token kernels over the copies take a token with a given routing (h will have x's dtype)."""
    return gate_up_pairs_mma_takes(packed, x, ids) and down_pairs_mma_takes(packed, x, ids)


def _released_error(what: str) -> ValueError:
    return ValueError(
        f"this MoE block's bf16 experts were released (--mma-experts-only), but {what}; the 12-bit copies need "
        "bf16 activations on CUDA and the shapes their kernels take"
    )


def fused_moe_triton(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
    shared_gate_up: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
    shared_expert_gate: torch.Tensor | None = None,
    plan: dict | None = None,
    force_large_routing: bool = False,
    out: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
    routing: tuple[torch.Tensor, torch.Tensor] | None = None,
    packed: MmaExperts | None = None,
) -> torch.Tensor:
    """x [T, H] -> [T, H] in x's dtype. ``packed``: the experts' 12-bit copies (``--mma-experts``), which the grouped
    path streams where ``mma_grouped.PLANS`` has its block size, and a one-token step with a given routing through
    ``mma_pairs``. ``plan`` overrides the tile plan
    (tests, tuning). With ``norm_weight`` the block's input is ``rms_norm(x)`` (inside the fused router where the
    plan takes it); with ``residual`` [T, H] (contiguous) the output is added to it in the down kernel and it is
    returned.
    ``routing`` (topk_ids [T, k] int32, the top-k raw logits [T, k] fp32 before the pre-norm's rstd): taken
    already (``kernels/routed_projection``), so no router runs; the gate_up kernel applies the pre-norm to x
    itself and takes the weights' softmax (``gate_up_pairs``'s norm_weight); the plan must take the pairs
    path (T <= 4) and a norm weight must be given."""
    T, H = x.shape
    E, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    released = isinstance(packed, MmaExperts) and packed.released
    if released and x.dtype != torch.bfloat16:
        raise _released_error(f"x is {x.dtype}")
    if residual is not None:
        out = residual
    elif out is None:
        out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    if T > PREFILL_CHUNK:
        for t0 in range(0, T, PREFILL_CHUNK):
            t1 = min(T, t0 + PREFILL_CHUNK)
            fused_moe_triton(
                x[t0:t1],
                gate_weight,
                w_gate_up,
                w_down,
                top_k,
                shared_gate_up,
                shared_down,
                shared_expert_gate,
                plan,
                force_large_routing,
                out[t0:t1],
                norm_weight=norm_weight,
                norm_eps=norm_eps,
                residual=residual[t0:t1] if residual is not None else None,
                packed=packed,
            )
        return out
    has_shared = shared_gate_up is not None and shared_down is not None
    fuse_shared = has_shared and shared_gate_up.shape == (two_i, H) and shared_down.shape == (H, inter)
    if plan is None:
        plan = get_plan(T, E, H, inter, top_k, x.dtype)
    if released and routing is not None and not _one_token_copies_take(packed, x, routing[0]):
        routing = None  # the grouped kernels over the copies route this token again
    if released and routing is None:
        plan = _copies_plan(plan)
    if released and not fuse_shared:
        raise _released_error("its shared expert is not folded into the copy")
    sgu, sd = (shared_gate_up, shared_down) if fuse_shared else (None, None)
    sg = shared_expert_gate if fuse_shared else None
    # the kernels write (or add to, with a residual) out directly, unless a shared expert is left to add
    direct = fuse_shared or not has_shared
    target = out if direct else None
    add_out = residual is not None and direct
    fused_router = plan.get("fused_router") and small_routing(T, E, top_k) and not force_large_routing
    routed_norm = {}
    if routing is not None:
        if plan["down_mode"] != "pairs" or norm_weight is None:
            raise ValueError(f"a given routing needs the pairs path (T <= 4) and a norm weight, got T={T}")
        ids, weights = routing
        routed_norm = dict(norm_weight=norm_weight, norm_eps=norm_eps)
        norm_weight = None
    if norm_weight is not None and not (fused_router and plan["down_mode"] == "pairs"):
        x = rms_norm(x, norm_weight, norm_eps)
        norm_weight = None
    if plan["down_mode"] == "pairs":
        logits, kw = None, {}
        if routing is not None:
            pass  # ids and raw top-k logits as given; x before its norm (routed_norm, to gate_up)
        elif fused_router and plan.get("topk_in_experts"):  # the expert kernels take the top-k themselves
            logits, xn = router_logits_fused(
                x, gate_weight, top_k, plan.get("router_be"), norm_weight, norm_eps
            )
            ids = weights = None
            x = xn if norm_weight is not None else x
            kw = dict(logits=logits, top_k=top_k)
        elif fused_router:
            rt = route_topk_fused(x, gate_weight, top_k, plan.get("router_be"), norm_weight, norm_eps)
            ids, weights = rt.topk_ids, rt.topk_weights
            x = rt.normed_x if norm_weight is not None else x
        else:
            ids, weights = route_topk(F.linear(x, gate_weight), top_k, x.dtype)
        args = (x, w_gate_up, sgu, sg, ids, weights, plan["gate_up"])
        if routing is not None and fuse_shared and gate_up_pairs_mma_takes(packed, x, ids):
            nw, eps = routed_norm["norm_weight"], routed_norm["norm_eps"]
            h = gate_up_pairs_mma(x, packed, ids.contiguous(), weights.contiguous(), nw, eps, sg)
        elif (
            plan.get("split_shared") and sgu is not None and routing is None
        ):  # routed launch streams pre-wait
            h = gate_up_pairs(*args, part="routed", h=gate_up_pairs(*args, part="shared", **kw), **kw)
        else:
            h = gate_up_pairs(*args, **kw, **routed_norm)
        if not kw and fuse_shared and down_pairs_mma_takes(packed, h, ids):
            res = down_pairs_mma(h, packed, ids.contiguous(), out=target, add_out=add_out)
        else:
            res = down_pairs(h, w_down, sd, ids, plan["down"], out=target, add_out=add_out, **kw)
    else:
        mma = packed if packed is not None and fuse_shared and x.dtype == torch.bfloat16 else None
        res = _grouped(
            x, gate_weight, w_gate_up, w_down, top_k, sgu, sd, sg, plan, force_large_routing, target, add_out, mma
        )  # fmt: skip
    if not direct:  # a shared expert of another width: plain torch, added in fp32
        if routed_norm:  # x is still the block's input: with a given routing only gate_up normed its copy
            x = rms_norm(x, routed_norm["norm_weight"], routed_norm["norm_eps"])
        shared = F.linear(silu_and_mul_reference(F.linear(x, shared_gate_up)), shared_down)
        if shared_expert_gate is not None:
            shared = torch.sigmoid(F.linear(x, shared_expert_gate)) * shared
        total = res.float() + shared.float()
        if residual is not None:
            total = residual.float() + total.to(x.dtype).float()
        out.copy_(total)
    return out


def _grouped(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
    shared_gate_up: torch.Tensor | None,
    shared_down: torch.Tensor | None,
    shared_expert_gate: torch.Tensor | None,
    plan: dict,
    force_large_routing: bool,
    out: torch.Tensor | None,
    add_out: bool,
    mma: MmaExperts | None = None,
) -> torch.Tensor:
    """Routing + grouping by expert, grouped gate_up, then the "reduce" or "scatter" down kernels; with ``mma``
    (``--mma-experts``) the gate_up and the scatter down stream the experts' 12-bit copies (``mma_grouped``)
    where its kernels take the block size."""
    T, E = x.shape[0], gate_weight.shape[0]
    bm = plan["block_m"]
    reduce = plan["down_mode"] == "reduce" and T <= MAX_REDUCE_TOKENS
    if not reduce and bm < 16:
        raise ValueError("block_m < 16 (GEMV variants) needs down_mode 'reduce' and T <= 128")
    with_shared = shared_gate_up is not None
    force_large_routing = force_large_routing or plan.get("large_routing", False)
    if plan.get("fused_router") and small_routing(T, E, top_k) and not force_large_routing:
        rt = route_and_align_fused(x, gate_weight, top_k, bm, with_shared)
    else:
        logits = F.linear(x, gate_weight)
        atomic = plan.get("atomic_routing", False)
        rt = route_and_align(
            logits, top_k, bm, with_shared, x.dtype, force_large=force_large_routing, atomic=atomic
        )
    routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks, bm)
    # a bucket's plan may keep the bf16 weights where they stream faster than the copies decode; a block with only
    # its copies has no choice
    copies_win = mma is not None and (mma.released or plan.get("mma_grouped", True))
    if copies_win and grouped_mma_takes(mma, bm, x.shape[1]):
        h = gate_up_grouped_mma(x, mma, shared_expert_gate, *routed)
        if mma.down is not None and not reduce:
            y = down_grouped_mma(h, mma, *routed)
            if out is None:
                out = torch.empty((T, x.shape[1]), dtype=x.dtype, device=x.device)
            return sum_rows(y, out, T, top_k, True, add_out)
        if mma.released:
            raise _released_error(f"the plan's {plan['down_mode']} down at T={T} has no 12-bit form")
    elif mma is not None and mma.released:
        raise _released_error(f"the grouped kernels do not take BLOCK_M {bm}")
    else:
        h = gate_up(x, w_gate_up, shared_gate_up, shared_expert_gate, *routed, plan["gate_up"])
    down = down_reduce if reduce else down_scatter_sum
    args = (h, w_down, shared_down, rt.sorted_pairs, rt.meta, rt.max_blocks, bm, T, top_k, plan["down"])
    return down(*args, out=out, add_out=add_out)
