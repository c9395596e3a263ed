"""The fused MoE router of the few-token path (decode): router GEMV, optional RMSNorm of its input, softmax,
top-k and (optionally) the grouping of ``routing.py``, in one launch.

At T <= 64 tokens (``routing.small_routing``) the router GEMV [T, H] x [H, E] is too small to spread over the
GPU by cuBLAS and the routing kernels after it, so one kernel does both: program p computes the logits of
experts [p*BE, (p+1)*BE) for all T tokens, then takes a ticket; the program that draws the last ticket sees
every logit and routes with the same functions as ``routing.py`` (so the ids and weights are the very ones
``route_topk`` / ``route_and_align`` would give from the logits). Entry points:

- ``route_and_align_fused``: ids, weights and the expert grouping (``Routing``), for the grouped expert kernels;
- ``route_topk_fused``: ids and weights only, for the pairs kernels (``triton_pairs.py``);
- ``router_logits_fused``: the logits alone; the pairs kernels then take each token's top-k themselves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require
from hyserve.kernels.moe.routing import (
    ROW_SPLIT,
    Routing,
    _group_small,
    _row_softmax_topk,
    _topk_store,
    max_blocks,
    round_code,
    small_routing,
)
from hyserve.kernels.moe.workspace import empty, launch
from hyserve.kernels.pdl import wait_for_previous
from hyserve.kernels.tickets import ticket_counters


@triton.jit
def _router_weights(g_rows, k, km, emask, USE_DOT: tl.constexpr):
    """The router weight tile of columns k: [BK, BE] for tl.dot, else [BE, BK]."""
    if USE_DOT:
        wt = tl.load(g_rows[None, :] + k[:, None], mask=km[:, None] & emask[None, :], other=0.0)
    else:
        wt = tl.load(g_rows[:, None] + k[None, :], mask=emask[:, None] & km[None, :], other=0.0)
    return wt


@triton.jit
def _router_acc(acc, xt, wt, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr):
    """acc [TP, BE] += xt [TP, BK] @ the weight tile of ``_router_weights``."""
    if USE_DOT:
        acc = tl.dot(xt, wt, acc, input_precision=DOT_PREC)
    elif xt.shape[0] == 1:  # one token: x broadcast over the [BE, BK] weight tile, no 3-D product layout
        acc += tl.sum(xt.to(tl.float32) * wt.to(tl.float32), axis=1)[None, :]
    else:
        acc += tl.sum(xt.to(tl.float32)[:, None, :] * wt.to(tl.float32)[None, :, :], axis=2)
    return acc


@triton.jit
def _router_x(rmask, k, km, xt, rstd, nw, xn_rows, owner, HAS_NORM: tl.constexpr):
    """The x tile [TP, BK] of columns k (``xt``: already loaded), RMS-normalised with the norm (``nw``: the
    norm weight's tile): rounded to x's dtype like ``rms_norm``'s output, and stored to xn by the program
    ``owner``."""
    if HAS_NORM:
        xt = (xt.to(tl.float32) * rstd[:, None] * (1.0 + nw.to(tl.float32))[None, :]).to(xt.dtype)
        mine = km & (k * 0 + owner == tl.program_id(0))
        tl.store(xn_rows[:, None] + k[None, :], xt, mask=rmask[:, None] & mine[None, :])
    return xt


@triton.jit(do_not_specialize=["T", "MAXB"])
def _router_route_kernel(
    x_ptr,
    stride_xt,
    nw_ptr,
    xn_ptr,
    stride_xnt,
    eps,
    gw_ptr,
    stride_ge,
    scratch_ptr,
    counter_ptr,
    ids_ptr,
    w_ptr,
    sorted_ptr,
    meta_ptr,
    T,
    E,
    H,
    MAXB,
    K: tl.constexpr,
    KP: tl.constexpr,
    TP: tl.constexpr,
    EP: tl.constexpr,
    BE: tl.constexpr,
    BK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROUND: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_PREC: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ROUTE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(E, BE),): the router GEMV fused with the small routing (decode, one launch).

    With HAS_NORM, x is the residual stream and the router's input is its RMSNorm (``nw``: the layer's
    zero-centred norm weight), which every program computes (one more pass over x, one load at T = 1 where
    a tile spans H) and the programs store to ``xn`` for the expert kernels, tile t by program t mod grid.

    Program p computes the logits of experts [p*BE, (p+1)*BE) for all T tokens (fp32 accumulation,
    rounded through x's dtype like ``F.linear``) into ``scratch [TP, EP]`` fp32, then takes a ticket
    from ``counter`` (acq_rel atomic, after a CTA barrier: the classic last-block reduction); the
    program that draws the last ticket sees every logit, routes (and groups, with GROUP), and resets the counter
    to 0 for the next launch (CUDA-graph replays included). The result does not depend on which
    program finishes last. The counter is one persistent tensor per device (``_counter``). The router
    weights are no kernel's output: their first tile loads while the previous kernel finishes (pdl.py).
    Without ROUTE the kernel stops at the logits (``router_logits_fused``: the expert kernels take the top-k
    themselves, ``token_topk``), so neither the ticket's round trip nor the last program's tail is on the path
    to the experts."""
    pid = tl.program_id(0)
    rows = tl.arange(0, TP)
    rmask = rows < T
    ee = pid * BE + tl.arange(0, BE)
    emask = ee < E
    kk = tl.arange(0, BK)
    x_rows = x_ptr + rows.to(tl.int64) * stride_xt
    g_rows = gw_ptr + ee.to(tl.int64) * stride_ge
    wt = _router_weights(g_rows, kk, kk < H, emask, USE_DOT)
    nw = tl.zeros((BK,), dtype=tl.float32)
    if HAS_NORM:
        nw = tl.load(nw_ptr + kk, mask=kk < H, other=0.0)
    wait_for_previous(USE_PDL)
    xmask = rmask[:, None] & (kk < H)[None, :]
    x0 = tl.load(x_rows[:, None] + kk[None, :], mask=xmask, other=0.0)
    rstd = tl.zeros((TP,), dtype=tl.float32)
    if HAS_NORM:
        ss = tl.sum(x0.to(tl.float32) * x0.to(tl.float32), axis=1)
        for k0 in range(BK, H, BK):
            k = k0 + kk
            xt = tl.load(x_rows[:, None] + k[None, :], mask=rmask[:, None] & (k < H)[None, :], other=0.0)
            ss += tl.sum(xt.to(tl.float32) * xt.to(tl.float32), axis=1)
        rstd = 1.0 / tl.sqrt(ss / H + eps)
    nprog = tl.num_programs(0)
    xn_rows = xn_ptr + rows.to(tl.int64) * stride_xnt
    xt = _router_x(rmask, kk, kk < H, x0, rstd, nw, xn_rows, 0, HAS_NORM)
    acc = tl.zeros((TP, BE), dtype=tl.float32)
    acc = _router_acc(acc, xt, wt, USE_DOT, DOT_PREC)
    for k0 in range(BK, H, BK):
        k = k0 + kk
        km = k < H
        wt = _router_weights(g_rows, k, km, emask, USE_DOT)
        xt = tl.load(x_rows[:, None] + k[None, :], mask=rmask[:, None] & km[None, :], other=0.0)
        if HAS_NORM:
            nw = tl.load(nw_ptr + k, mask=km, other=0.0)
        xt = _router_x(rmask, k, km, xt, rstd, nw, xn_rows, (k0 // BK) % nprog, HAS_NORM)
        acc = _router_acc(acc, xt, wt, USE_DOT, DOT_PREC)
    acc = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(scratch_ptr + rows[:, None] * EP + ee[None, :], acc, mask=rmask[:, None] & emask[None, :])
    if ROUTE:
        _route_last(scratch_ptr, counter_ptr, ids_ptr, w_ptr, sorted_ptr, meta_ptr, rows, rmask, T, E, MAXB,
                    K, KP, TP, EP, BLOCK_M, ROUND, HAS_SHARED, GROUP)  # fmt: skip


@triton.jit
def _route_last(
    scratch_ptr,
    counter_ptr,
    ids_ptr,
    w_ptr,
    sorted_ptr,
    meta_ptr,
    rows,
    rmask,
    T,
    E,
    MAXB,
    K: tl.constexpr,
    KP: tl.constexpr,
    TP: tl.constexpr,
    EP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROUND: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    GROUP: tl.constexpr,
):
    """The last-block reduction of ``_router_route_kernel``: the program that draws the last ticket routes."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        if TP == 1 and not GROUP:  # top-k of one token (the pairs path at T = 1): sub-rows a warp
            ids, w = _row_softmax_topk(scratch_ptr, E, EP, K, KP, ROUND, ROW_SPLIT)
            kc = tl.arange(0, KP)
            tl.store(ids_ptr + kc, ids, mask=kc < K)
            tl.store(w_ptr + kc, w, mask=kc < K)
            tl.store(counter_ptr, 0)
            return
        cols = tl.arange(0, EP)
        logits = tl.load(
            scratch_ptr + rows[:, None] * EP + cols[None, :],
            mask=rmask[:, None] & (cols[None, :] < E),
            other=0.0,
            cache_modifier=".cg",
        )
        logits = tl.where(cols[None, :] < E, logits, float("-inf"))
        if GROUP:
            _group_small(
                logits,
                rows,
                cols,
                T,
                E,
                MAXB,
                ids_ptr,
                w_ptr,
                sorted_ptr,
                meta_ptr,
                K,
                KP,
                TP,
                EP,
                BLOCK_M,
                ROUND,
                HAS_SHARED,
            )
        else:  # top-k only (the pairs path)
            _topk_store(logits, rows, rmask, cols, E, ids_ptr, w_ptr, K, KP, ROUND)
        tl.store(counter_ptr, 0)


def _counter(device: torch.device) -> torch.Tensor:
    """The fused router's ticket counter (``kernels/tickets.py``)."""
    return ticket_counters("moe router", device, 1)


def route_and_align_fused(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    top_k: int,
    block_m: int,
    with_shared: bool,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
) -> Routing:
    """Router GEMV + routing + grouping in one launch (``_router_route_kernel``); needs small_routing.
    With ``norm_weight`` the router's input is ``rms_norm(x)``, returned as ``normed_x``."""
    return _router_route(x, gate_weight, top_k, block_m, with_shared, True, None, norm_weight, norm_eps)


def route_topk_fused(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    top_k: int,
    block_e: int | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
) -> Routing:
    """Router GEMV + softmax/top-k in one launch, no grouping: ``topk_ids [T, k]`` int32 and
    ``topk_weights [T, k]`` fp32 as ``route_topk`` gives from logits (the other fields unused).
    ``block_e``: experts per program (grid E/block_e). With ``norm_weight`` the router's input is
    ``rms_norm(x)``, returned as ``normed_x``."""
    return _router_route(x, gate_weight, top_k, 16, False, False, block_e, norm_weight, norm_eps)


def router_logits_fused(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    top_k: int,
    block_e: int | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused router without its routing: (logits [TP, EP] fp32, row stride EP = next_pow2(E), rows
    >= T and columns >= E unset; ``rms_norm(x)`` [T, H] with ``norm_weight``, else None). The expert kernels
    take each token's top-k from the logits (``token_topk``), which is what ``route_topk_fused`` would store."""
    rt = _router_route(x, gate_weight, top_k, 16, False, False, block_e, norm_weight, norm_eps, route=False)
    return rt.logits, rt.normed_x


def _router_route(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    top_k: int,
    block_m: int,
    with_shared: bool,
    group: bool,
    block_e: int | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    route: bool = True,
) -> Routing:
    T, H = x.shape
    E = gate_weight.shape[0]
    dev = x.device
    require(small_routing(T, E, top_k), "the fused router takes small batches only (routing.small_routing)")
    require(
        x.stride(1) == 1 and gate_weight.stride(1) == 1,
        "the fused router needs x and gate_weight with a contiguous last dim",
    )
    xn = empty((T, H), x.dtype, dev) if norm_weight is not None else None
    EP = triton.next_power_of_2(E)
    KP = triton.next_power_of_2(top_k)
    TP = triton.next_power_of_2(T)
    use_dot = TP >= 16
    if use_dot:
        be, bk = 16, 128
    else:
        be = block_e or 8
        bk = max(64, 8192 // (TP * be))
    n = T * top_k
    mb = max_blocks(T, E, top_k, block_m, with_shared) if group else 1
    ids = empty((T, top_k), torch.int32, dev)
    w = empty((T, top_k), torch.float32, dev)
    sorted_pairs = empty((n if group else 1,), torch.int32, dev)
    meta = empty((3 * mb + 1,), torch.int32, dev)
    scratch = empty((TP, EP), torch.float32, dev)
    launch(
        _router_route_kernel,
        (triton.cdiv(E, be),),
        x,
        x.stride(0),
        norm_weight if norm_weight is not None else x,
        xn if xn is not None else x,
        xn.stride(0) if xn is not None else 0,
        norm_eps,
        gate_weight,
        gate_weight.stride(0),
        scratch,
        _counter(dev),
        ids,
        w,
        sorted_pairs,
        meta,
        T,
        E,
        H,
        mb,
        K=top_k,
        KP=KP,
        TP=TP,
        EP=EP,
        BE=be,
        BK=bk,
        BLOCK_M=block_m,
        ROUND=round_code(x.dtype),
        HAS_SHARED=with_shared,
        USE_DOT=use_dot,
        DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32",
        GROUP=group,
        HAS_NORM=norm_weight is not None,
        ROUTE=route,
        num_warps=8 if TP * EP >= 4096 else 4,
    )
    return Routing(ids, w, sorted_pairs, meta, mb, block_m, xn, scratch)
