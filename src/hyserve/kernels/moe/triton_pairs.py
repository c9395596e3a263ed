"""The few-token MoE path: one program column per (token, expert) pair, no grouping by expert.

At T <= 4 tokens almost every pair has an expert of its own (T*k pairs over E=256 experts), so grouping
buys no weight reuse, and its dependent loads (block list -> sorted pairs -> token -> weights) sit in
front of the weight stream of every program. Here the only dependent load is the expert id:

- ``gate_up_pairs``: grid (cdiv(I, BLOCK_I), T*k + T). Program (n, p) streams the gate rows
  [n*BLOCK_I, (n+1)*BLOCK_I) and the matching up rows of pair p's expert (p >= T*k: the shared expert of
  token p - T*k) over the full K = H, as a GEMV (fp32 broadcast-multiply, one reduction at the end), and
  writes ``h[p] = w_p * silu(x W_g^T) * (x W_u^T)`` with w_p the routing weight (the shared expert:
  sigmoid(x . shared_expert_gate)). Many small programs keep every SM streaming.
- ``down_pairs``: grid (cdiv(H, BLOCK_H), T). Program (hb, t) loads the BLOCK_H down rows of all k
  experts of token t at once (a [k, BLOCK_H, BLOCK_I] gather, so the k weight streams are in flight
  together) plus the shared expert's, multiplies by the h rows and sums over experts and I in fp32:
  ``out[t] = sum_j h[t*k+j] @ W_down[e_j]^T + h[N+t] @ shared_down^T``. Deterministic, no atomics.

A pair that repeats an expert of another token re-reads its weights: the plan takes this path only where
that is rare (``configs``: ``"down_mode": "pairs"``). Routing: ``router.route_topk_fused`` (ids and
weights only), or (``logits=``, the plan's ``topk_in_experts``) the router's logits alone
(``router.router_logits_fused``), from which each program takes its token's top-k itself
(``routing.token_topk``, the same function the router's last program would run): the gate_up kernel after its
PDL wait, the down kernel before it (the router ran two launches back). That takes the router's ticket (an
acq_rel round trip), its last program's logit reload and the ids' store and reload off the path from the
router to the expert weights, for a softmax and top-k over E in every program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels import pdl, tma
from hyserve.kernels.l2_prefetch import prefetch_l2, prefetch_parts
from hyserve.kernels.moe.routing import round_code, token_topk
from hyserve.kernels.moe.workspace import empty, launch
from hyserve.kernels.pdl import wait_for_previous


@triton.jit
def _gate_up_tile(
    acc_g,
    acc_u,
    ss,
    wg,
    wu,
    x_row,
    nw_ptr,
    k,
    km,
    REDUCE_EACH: tl.constexpr,
    NORM_X: tl.constexpr,
    BCAST_X: tl.constexpr,
):
    """acc += the [BLOCK_I, BLOCK_K] gate and up tiles times x[k]: kept [BLOCK_I, BLOCK_K] wide and reduced
    once at the end, or (REDUCE_EACH) reduced over k every tile into [BLOCK_I, 1] (fewer registers). BCAST_X: x
    (and the norm weight) loaded straight into the tiles' [BLOCK_I, BLOCK_K] layout, the same row for every i
    (L1 serves the repeats), instead of as [BLOCK_K] and broadcast through shared memory every K step (the
    GEMV's option of the same name). NORM_X (with BCAST_X): x is the block's input before its pre-norm: ss
    [BLOCK_I, BLOCK_K // 8] += x[k]^2 summed over runs of 8 (the 8 a thread holds after a 16-byte load: the sum
    stays inside the thread, no shuffle in the loop; every row the same) and x[k] is multiplied by 1 + nw[k]
    (the caller applies rstd at the end, as the GEMV's fused norm does)."""
    if BCAST_X:
        at = tl.zeros((wg.shape[0], 1), dtype=tl.int32) + k[None, :]
        xk = tl.load(x_row + at, mask=km[None, :], other=0.0).to(tl.float32)
        if NORM_X:
            sq = xk * xk
            ss += tl.sum(tl.reshape(sq, (sq.shape[0], sq.shape[1] // 8, 8)), axis=2)
            xk = xk * (1.0 + tl.load(nw_ptr + at, mask=km[None, :], other=0.0).to(tl.float32))
    else:
        xk = tl.load(x_row + k, mask=km, other=0.0).to(tl.float32)[None, :]
    if REDUCE_EACH:
        acc_g += tl.sum(wg.to(tl.float32) * xk, axis=1, keep_dims=True)
        acc_u += tl.sum(wu.to(tl.float32) * xk, axis=1, keep_dims=True)
    else:
        acc_g += wg.to(tl.float32) * xk
        acc_u += wu.to(tl.float32) * xk
    return acc_g, acc_u, ss


@triton.jit
def _gate_up_tma(desc, row_g, row_u, acc_g, acc_u, ss, x_row, nw_ptr, kk, H, BLOCK_K: tl.constexpr,
                 REDUCE_EACH: tl.constexpr, NORM_X: tl.constexpr, BCAST_X: tl.constexpr,
                 STAGES: tl.constexpr):  # fmt: skip
    """acc += the gate rows [row_g, +BLOCK_I) and up rows [row_u, +BLOCK_I) of the descriptor's matrix times x,
    over K = H, the tile copies pipelined STAGES-1 deep."""
    for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):
        k = k0 + kk
        wg = desc.load([row_g, k0])
        wu = desc.load([row_u, k0])
        acc_g, acc_u, ss = _gate_up_tile(
            acc_g, acc_u, ss, wg, wu, x_row, nw_ptr, k, k < H, REDUCE_EACH, NORM_X, BCAST_X
        )
    return acc_g, acc_u, ss


@triton.jit
def _topk_weight(raw, j, rstd, K_TOP: tl.constexpr, ROUND: tl.constexpr, dtype: tl.constexpr):
    """The routing weight of slot j from the token's top-k raw router logits ``raw`` ([BLOCK_I, KP] fp32, every
    row the same: ``kernels/routed_projection``'s logits before the norm's rstd), as [BLOCK_I] (rstd [BLOCK_I],
    every element the same): the logits scaled and rounded through the model dtype as the router's F.linear
    output is, their softmax (the renormalised top-k of the softmax over all experts), rounded like the
    router's weights (ROUND). The rows keep the tiles' layout, each in one warp: no barrier between warps."""
    kc = tl.arange(0, raw.shape[1])[None, :]
    logit = tl.where(kc < K_TOP, (raw * rstd[:, None]).to(dtype).to(tl.float32), float("-inf"))
    p = tl.exp(logit - tl.max(logit, axis=1)[:, None])
    w = tl.sum(tl.where(kc == j, p, 0.0), axis=1) / tl.sum(p, axis=1)
    if ROUND == 1:
        w = w.to(tl.bfloat16).to(tl.float32)
    elif ROUND == 2:
        w = w.to(tl.float16).to(tl.float32)
    return w


@triton.jit
def _gate_up_finish(
    g,
    u,
    ss,
    wrow,
    is_shared,
    p,
    pc,
    tok,
    x_row,
    nw_ptr,
    sg_ptr,
    topk_w_ptr,
    h_ptr,
    ii,
    imask,
    kk,
    eps,
    H,
    I,
    K_TOP: tl.constexpr,
    KP: tl.constexpr,
    ROUND: tl.constexpr,
    HAS_SHARED_GATE: tl.constexpr,
    NORM_X: tl.constexpr,
    LATE_WAIT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """A gate_up program's end, whatever its weights' format: g, u [BLOCK_I] (x W_g^T, x W_u^T of rows ii),
    ss x's squares (NORM_X: before the pre-norm, [BLOCK_I, *], every row alike) -> the rstd, the pair's weight
    (wrow; NORM_X: the softmax of its token's raw top-k logits; the shared expert: its sigmoid gate, a pass
    over x), ``h[p] = silu(g) u w`` stored."""
    rstd = 1.0
    if NORM_X:  # x's RMS norm from the loads the products used; its weight went in with each tile
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=1) / H + eps)  # [BLOCK_I], a reduction inside each row's warp
        g = g * rstd
        u = u * rstd
        # the pair's weight: softmax over its token's top-k logits, scaled by rstd now ([BLOCK_I] from here on)
        kt = tl.zeros((ii.shape[0], 1), dtype=tl.int32) + tl.arange(0, KP)[None, :]
        raw = tl.load(topk_w_ptr + tok * K_TOP + kt, mask=kt < K_TOP, other=0.0)
        tw = _topk_weight(raw, pc % K_TOP, rstd, K_TOP, ROUND, x_row.dtype.element_ty)
        wrow = tl.where(is_shared, wrow, tw)

    if HAS_SHARED_GATE:
        if is_shared:
            sacc = tl.zeros((kk.shape[0],), dtype=tl.float32)
            for k0 in range(0, H, kk.shape[0]):
                k = k0 + kk
                km = k < H
                xk = tl.load(x_row + k, mask=km, other=0.0).to(tl.float32)
                if NORM_X:
                    xk = xk * (1.0 + tl.load(nw_ptr + k, mask=km, other=0.0).to(tl.float32))
                sacc += xk * tl.load(sg_ptr + k, mask=km, other=0.0).to(tl.float32)
            wrow = 1.0 / (1.0 + tl.exp(-tl.sum(sacc, axis=0) * rstd))
    else:
        wrow = tl.where(is_shared, 1.0, wrow)
    h = g / (1.0 + tl.exp(-g)) * u * wrow
    if LATE_WAIT:
        wait_for_previous(USE_PDL)
    tl.store(h_ptr + p.to(tl.int64) * I + ii, h.to(h_ptr.dtype.element_ty), mask=imask)


@triton.jit(do_not_specialize=["P0"])
def _gate_up_pairs_kernel(
    x_ptr,
    w_ptr,
    sw_ptr,
    w_desc,
    sw_desc,
    sg_ptr,
    ids_ptr,
    topk_w_ptr,
    h_ptr,
    nw_ptr,
    eps,
    T,
    H,
    I,
    E,
    P0,
    stride_xt,
    stride_we,
    stride_wn,
    stride_sn,
    sw_bytes,
    K_TOP: tl.constexpr,
    KP: tl.constexpr,
    EP: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_SHARED_GATE: tl.constexpr,
    REDUCE_EACH: tl.constexpr,
    PREFETCH: tl.constexpr,
    LATE_WAIT: tl.constexpr,
    FROM_LOGITS: tl.constexpr,
    ROUND: tl.constexpr,
    TMA: tl.constexpr,
    L2PF: tl.constexpr,
    NORM_X: tl.constexpr,
    BCAST_X: tl.constexpr,
    SHARED_FIRST: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Pair p = P0 + program_id(1), or with SHARED_FIRST (all pairs in one launch) the T shared-expert pairs
    first. REDUCE_EACH, PREFETCH, LATE_WAIT, TMA, L2PF, NORM_X, BCAST_X, SHARED_FIRST: see ``gate_up_pairs``
    (w_desc, sw_desc: the routed experts' [E*2I, H] and the shared expert's [2I, H] descriptors; sw_bytes: the
    shared expert's weight size, the L2PF range). FROM_LOGITS: ``ids_ptr`` is the router's logits [*, EP] fp32
    and the pair's expert and weight come from its token's top-k (``topk_w_ptr`` unused)."""
    n = tl.program_id(0)
    if L2PF > 0:
        lin = n + tl.num_programs(0) * tl.program_id(1)
        if lin < L2PF:
            prefetch_l2(sw_ptr, sw_bytes, lin, L2PF, 512)
    if not LATE_WAIT:
        wait_for_previous(USE_PDL)
    if SHARED_FIRST:
        q = tl.program_id(1)
        p = tl.where(q < T, T * K_TOP + q, q - T)
    else:
        p = tl.program_id(1) + P0
    N = T * K_TOP
    is_shared = p >= N
    pc = tl.minimum(p, N - 1)
    tok = tl.where(is_shared, p - N, p // K_TOP).to(tl.int64)
    if FROM_LOGITS:
        kc = tl.arange(0, KP)
        tids, tw = token_topk(ids_ptr, pc // K_TOP, E, EP, K_TOP, KP, ROUND)
        e = tl.sum(tl.where(kc == pc % K_TOP, tids, 0), axis=0).to(tl.int64)
        wrow = tl.sum(tl.where(kc == pc % K_TOP, tw, 0.0), axis=0)
    else:
        e = tl.load(ids_ptr + pc).to(tl.int64)
        wrow = tl.load(topk_w_ptr + pc)  # NORM_X: unused (the weight comes from the raw logits at the end)
    wbase = tl.where(is_shared, sw_ptr, w_ptr + e * stride_we)
    stride_n = tl.where(is_shared, stride_sn, stride_wn)

    ii = n * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = ii < I
    kk = tl.arange(0, BLOCK_K)
    x_row = x_ptr + tok * stride_xt
    g_rows = wbase + ii.to(tl.int64)[:, None] * stride_n
    u_rows = wbase + (ii + I).to(tl.int64)[:, None] * stride_n
    acc_g = tl.zeros((BLOCK_I, 1 if REDUCE_EACH else BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_I, 1 if REDUCE_EACH else BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_I, BLOCK_K // 8), dtype=tl.float32)  # NORM_X: x^2 in runs of 8, rows alike
    if TMA:  # rows past the slice's end read other rows (or zeros): their results are never stored
        if is_shared:
            acc_g, acc_u, ss = _gate_up_tma(sw_desc, n * BLOCK_I, I + n * BLOCK_I, acc_g, acc_u, ss, x_row, nw_ptr,
                                            kk, H, BLOCK_K, REDUCE_EACH, NORM_X, BCAST_X, TMA)  # fmt: skip
        else:
            row = e.to(tl.int32) * (2 * I) + n * BLOCK_I
            acc_g, acc_u, ss = _gate_up_tma(w_desc, row, row + I, acc_g, acc_u, ss, x_row, nw_ptr, kk, H, BLOCK_K,
                                            REDUCE_EACH, NORM_X, BCAST_X, TMA)  # fmt: skip
    elif PREFETCH:  # the next tiles' loads are issued before this tile's multiply: two tiles in flight
        wm = imask[:, None] & (kk < H)[None, :]
        wg = tl.load(g_rows + kk[None, :], mask=wm, other=0.0)
        wu = tl.load(u_rows + kk[None, :], mask=wm, other=0.0)
        for k0 in range(BLOCK_K, H, BLOCK_K):
            k = k0 + kk
            km = k < H
            wg_next = tl.load(g_rows + k[None, :], mask=imask[:, None] & km[None, :], other=0.0)
            wu_next = tl.load(u_rows + k[None, :], mask=imask[:, None] & km[None, :], other=0.0)
            kp = k - BLOCK_K
            acc_g, acc_u, ss = _gate_up_tile(
                acc_g, acc_u, ss, wg, wu, x_row, nw_ptr, kp, kp < H, REDUCE_EACH, NORM_X, BCAST_X
            )
            wg, wu = wg_next, wu_next
        kl = ((H - 1) // BLOCK_K) * BLOCK_K + kk
        acc_g, acc_u, ss = _gate_up_tile(
            acc_g, acc_u, ss, wg, wu, x_row, nw_ptr, kl, kl < H, REDUCE_EACH, NORM_X, BCAST_X
        )
    else:
        for k0 in range(0, H, BLOCK_K):
            k = k0 + kk
            km = k < H
            wm = imask[:, None] & km[None, :]
            wg = tl.load(g_rows + k[None, :], mask=wm, other=0.0)
            wu = tl.load(u_rows + k[None, :], mask=wm, other=0.0)
            acc_g, acc_u, ss = _gate_up_tile(
                acc_g, acc_u, ss, wg, wu, x_row, nw_ptr, k, km, REDUCE_EACH, NORM_X, BCAST_X
            )
    g = tl.sum(acc_g, axis=1)
    u = tl.sum(acc_u, axis=1)
    _gate_up_finish(g, u, ss, wrow, is_shared, p, pc, tok, x_row, nw_ptr, sg_ptr, topk_w_ptr, h_ptr, ii, imask, kk,
                    eps, H, I, K_TOP, KP, ROUND, HAS_SHARED_GATE, NORM_X, LATE_WAIT, USE_PDL)  # fmt: skip


@triton.jit
def _down_tile(
    acc, acc_s, w, ws, h_rows, hs_row, i, jm, im, HAS_SHARED: tl.constexpr, REDUCE_EACH: tl.constexpr
):
    """acc [KP, BLOCK_H, BLOCK_I] += w * h[i]; acc_s [BLOCK_H, BLOCK_I] += ws * h_shared[i] (REDUCE_EACH:
    summed over i every tile, into [KP, BLOCK_H] and [BLOCK_H])."""
    hv = tl.load(h_rows + i[None, :], mask=jm[:, None] & im[None, :], other=0.0)
    if REDUCE_EACH:
        acc += tl.sum(w.to(tl.float32) * hv.to(tl.float32)[:, None, :], axis=2)
    else:
        acc += w.to(tl.float32) * hv.to(tl.float32)[:, None, :]
    if HAS_SHARED:
        hsv = tl.load(hs_row + i, mask=im, other=0.0)
        if REDUCE_EACH:
            acc_s += tl.sum(ws.to(tl.float32) * hsv.to(tl.float32)[None, :], axis=1)
        else:
            acc_s += ws.to(tl.float32) * hsv.to(tl.float32)[None, :]
    return acc, acc_s


@triton.jit
def _down_pairs_kernel(
    h_ptr,
    wd_ptr,
    swd_ptr,
    ids_ptr,
    out_ptr,
    T,
    H,
    I,
    E,
    stride_we,
    stride_wh,
    stride_sh,
    stride_ot,
    K_TOP: tl.constexpr,
    KP: tl.constexpr,
    EP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_I: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    ADD_OUT: tl.constexpr,
    REDUCE_EACH: tl.constexpr,
    PREFETCH: tl.constexpr,
    FROM_LOGITS: tl.constexpr,
    ROUND: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(H, BLOCK_H), T). The expert ids come from the routing, two launches back (the gate_up
    kernel runs between), and the weights are no kernel's output: both load, with the first weight tiles,
    while the gate_up kernel finishes; its h only after the wait (kernels/pdl.py). FROM_LOGITS: ``ids_ptr``
    is the router's logits and the ids are token t's top-k, also taken before the wait."""
    hb = tl.program_id(0)
    t = tl.program_id(1)
    N = T * K_TOP
    j = tl.arange(0, KP)
    jm = j < K_TOP
    if FROM_LOGITS:
        e = token_topk(ids_ptr, t, E, EP, K_TOP, KP, ROUND)[0].to(tl.int64)
    else:
        e = tl.load(ids_ptr + t * K_TOP + j, mask=jm, other=0).to(tl.int64)
    hh = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hh < H
    ii = tl.arange(0, BLOCK_I)
    # [KP, BLOCK_H, 1] row pointers of the k experts; [KP, 1] h rows of the k pairs
    w_rows = wd_ptr + e[:, None, None] * stride_we + hh.to(tl.int64)[None, :, None] * stride_wh
    h_rows = h_ptr + (t * K_TOP + j).to(tl.int64)[:, None] * I
    s_rows = swd_ptr + hh.to(tl.int64)[:, None] * stride_sh
    hs_row = h_ptr + (N + t).to(tl.int64) * I
    wmask = jm[:, None, None] & hm[None, :, None]
    im = ii < I
    w = tl.load(w_rows + ii[None, None, :], mask=wmask & im[None, None, :], other=0.0)
    ws = w  # unused without a shared expert
    if HAS_SHARED:
        ws = tl.load(s_rows + ii[None, :], mask=hm[:, None] & im[None, :], other=0.0)
    wait_for_previous(USE_PDL)
    o_ptrs = out_ptr + t.to(tl.int64) * stride_ot + hh
    r = 0.0
    if ADD_OUT:  # out is the residual stream: out += the MoE output, in fp32 before the one cast
        r = tl.load(o_ptrs, mask=hm, other=0.0).to(tl.float32)
    if REDUCE_EACH:
        acc = tl.zeros((KP, BLOCK_H), dtype=tl.float32)
        acc_s = tl.zeros((BLOCK_H,), dtype=tl.float32)
    else:
        acc = tl.zeros((KP, BLOCK_H, BLOCK_I), dtype=tl.float32)
        acc_s = tl.zeros((BLOCK_H, BLOCK_I), dtype=tl.float32)
    if PREFETCH:  # the next tiles' loads are issued before this tile's multiply: two tiles in flight
        for i0 in range(BLOCK_I, I, BLOCK_I):
            i = i0 + ii
            im = i < I
            w_next = tl.load(w_rows + i[None, None, :], mask=wmask & im[None, None, :], other=0.0)
            ws_next = w_next
            if HAS_SHARED:
                ws_next = tl.load(s_rows + i[None, :], mask=hm[:, None] & im[None, :], other=0.0)
            ip = i - BLOCK_I
            acc, acc_s = _down_tile(
                acc, acc_s, w, ws, h_rows, hs_row, ip, jm, ip < I, HAS_SHARED, REDUCE_EACH
            )
            w, ws = w_next, ws_next
        il = ((I - 1) // BLOCK_I) * BLOCK_I + ii
        acc, acc_s = _down_tile(acc, acc_s, w, ws, h_rows, hs_row, il, jm, il < I, HAS_SHARED, REDUCE_EACH)
    else:
        acc, acc_s = _down_tile(acc, acc_s, w, ws, h_rows, hs_row, ii, jm, im, HAS_SHARED, REDUCE_EACH)
        for i0 in range(BLOCK_I, I, BLOCK_I):
            i = i0 + ii
            im = i < I
            w = tl.load(w_rows + i[None, None, :], mask=wmask & im[None, None, :], other=0.0)
            if HAS_SHARED:
                ws = tl.load(s_rows + i[None, :], mask=hm[:, None] & im[None, :], other=0.0)
            acc, acc_s = _down_tile(acc, acc_s, w, ws, h_rows, hs_row, i, jm, im, HAS_SHARED, REDUCE_EACH)
    if REDUCE_EACH:
        y = tl.sum(acc, axis=0)
        if HAS_SHARED:
            y += acc_s
    else:
        y = tl.sum(tl.sum(acc, axis=2), axis=0)
        if HAS_SHARED:
            y += tl.sum(acc_s, axis=1)
    tl.store(o_ptrs, (y + r).to(out_ptr.dtype.element_ty), mask=hm)


def gate_up_pairs(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    shared_gate_up: torch.Tensor | None,
    shared_expert_gate: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    cfg: dict,
    part: str = "all",
    h: torch.Tensor | None = None,
    *,
    logits: torch.Tensor | None = None,
    top_k: int | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
) -> torch.Tensor:
    """-> h [T*k + T, I] (rows T*k.. for the shared expert, unused without one). The routing: ``topk_ids`` /
    ``topk_weights`` [T, k], or (both None) the router's ``logits`` [TP, EP] fp32 from
    ``router.router_logits_fused`` and ``top_k``. With ``norm_weight`` (NORM_X) x is the block's input before
    its pre-norm, which every program applies itself (rstd from the x loads of its K loop, as the GEMV's fused
    norm), and ``topk_weights`` holds the top-k raw logits before rstd (``kernels/routed_projection``), whose
    softmax each program takes at its end. cfg: BLOCK_I, BLOCK_K,
    num_warps, and options (default off; ``moe.bench --pairs`` times the first two): REDUCE_EACH (reduce the
    products over K every tile instead of once at the end: fewer registers, more programs resident) and
    PREFETCH (load the next tiles before multiplying this one: two tiles in flight a program); TMA (a stage
    count: the weights through Hopper tensor descriptors, the K loop pipelined that deep; BLOCK_K <= 256,
    ignored where a descriptor cannot be made); L2PF (a program count: the first programs, resident while the
    router runs, prefetch the shared expert's weights into L2 before the PDL wait, ``kernels/l2_prefetch.py``;
    with PDL and a contiguous shared weight only); BCAST_X (x loaded in the tiles' layout, ``_gate_up_tile``;
    always on with ``norm_weight``); SHARED_FIRST (with ``part`` "all" and a shared expert: the shared expert's
    program columns run first. Its programs also take the shared gate, a second pass over x after the K loop;
    listed last they are the kernel's tail, listed first that pass overlaps the routed experts' weight stream,
    as the grouped path's block list does); maxnreg (a register cap a thread: more programs resident an SM,
    e.g. the ~1150 programs of a batch-1 step in one wave, at the price of spills; CUDA only).

    ``part``: "all" pairs in one launch, or the shared expert's rows alone ("shared") and then the routed
    pairs alone into the same ``h`` ("routed", launched right after "shared"). The routed launch then reads
    only what kernels two launches back wrote (ids, weights and x from the routing), so under PDL it loads
    and multiplies everything before its wait and waits only to store: its weight stream starts as soon
    as the routing has finished, overlapping the shared expert's launch (the plan's ``split_shared``)."""
    if part not in ("all", "shared", "routed"):
        raise ValueError(f"part must be 'all', 'shared' or 'routed', got {part!r}")
    T, H = x.shape
    E, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    route, k_top = _routing_operands(topk_ids, topk_weights, logits, top_k, E)
    if norm_weight is not None and (logits is not None or part != "all"):
        raise ValueError(
            "gate_up_pairs: norm_weight takes given top-k ids and raw logits, all pairs in one launch"
        )
    has_shared = shared_gate_up is not None
    if part != "all" and not has_shared:
        raise ValueError("gate_up_pairs: part 'shared' / 'routed' needs a shared expert")
    if h is None:
        h = empty((T * k_top + T, inter), x.dtype, x.device)
    sw = shared_gate_up if has_shared else w_gate_up
    sg = shared_expert_gate if shared_expert_gate is not None else x
    first, count = {
        "all": (0, T * k_top + (T if has_shared else 0)),
        "shared": (T * k_top, T),
        "routed": (0, T * k_top),
    }[part]
    grid = (triton.cdiv(inter, cfg["BLOCK_I"]), count)
    descs = (
        tma.expert_descriptors(w_gate_up, sw, [cfg["BLOCK_I"], cfg["BLOCK_K"]]) if cfg.get("TMA") else None
    )
    launch(
        _gate_up_pairs_kernel,
        grid,
        x,
        w_gate_up,
        sw,
        *(descs or (w_gate_up, sw)),
        sg,
        *route,
        h,
        norm_weight if norm_weight is not None else x,
        norm_eps,
        T,
        H,
        inter,
        E,
        first,
        x.stride(0),
        w_gate_up.stride(0),
        w_gate_up.stride(1),
        sw.stride(0),
        sw.numel() * sw.element_size(),
        K_TOP=k_top,
        KP=triton.next_power_of_2(k_top),
        EP=triton.next_power_of_2(E),
        BLOCK_I=cfg["BLOCK_I"],
        BLOCK_K=cfg["BLOCK_K"],
        HAS_SHARED_GATE=has_shared and shared_expert_gate is not None,
        REDUCE_EACH=bool(cfg.get("REDUCE_EACH", False)),
        PREFETCH=bool(cfg.get("PREFETCH", False)),
        LATE_WAIT=part == "routed",
        FROM_LOGITS=logits is not None,
        ROUND=round_code(x.dtype),
        TMA=int(cfg["TMA"]) if descs else 0,
        L2PF=prefetch_parts(cfg, pdl.enabled(x)) if has_shared and sw.is_contiguous() else 0,
        NORM_X=norm_weight is not None,
        BCAST_X=norm_weight is not None or bool(cfg.get("BCAST_X", False)),
        SHARED_FIRST=part == "all" and has_shared and bool(cfg.get("SHARED_FIRST", False)),
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 1),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
    )
    return h


def down_pairs(
    h: torch.Tensor,
    w_down: torch.Tensor,
    shared_down: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    cfg: dict,
    out: torch.Tensor | None = None,
    add_out: bool = False,
    *,
    logits: torch.Tensor | None = None,
    top_k: int | None = None,
) -> torch.Tensor:
    """h [T*k + T, I] -> out [T, H] (the weighted sum over the k experts plus the shared expert); with
    ``add_out`` the result is added to out's contents (the residual stream). The routing: ``topk_ids``
    [T, k], or ``logits`` and ``top_k`` as in ``gate_up_pairs``. cfg: BLOCK_H, BLOCK_I, num_warps, and
    REDUCE_EACH / PREFETCH / maxnreg as in ``gate_up_pairs`` (default off)."""
    E, H, inter = w_down.shape
    route, k_top = _routing_operands(topk_ids, None, logits, top_k, E)
    T = h.shape[0] // (k_top + 1)  # h: T*k routed rows, then T shared rows
    if out is None:
        out = torch.empty((T, H), dtype=h.dtype, device=h.device)
    has_shared = shared_down is not None
    sd = shared_down if has_shared else w_down
    launch(
        _down_pairs_kernel,
        (triton.cdiv(H, cfg["BLOCK_H"]), T),
        h,
        w_down,
        sd,
        route[0],
        out,
        T,
        H,
        inter,
        E,
        w_down.stride(0),
        w_down.stride(1),
        sd.stride(-2),
        out.stride(0),
        K_TOP=k_top,
        KP=triton.next_power_of_2(k_top),
        EP=triton.next_power_of_2(E),
        BLOCK_H=cfg["BLOCK_H"],
        BLOCK_I=cfg["BLOCK_I"],
        HAS_SHARED=has_shared,
        ADD_OUT=add_out,
        REDUCE_EACH=bool(cfg.get("REDUCE_EACH", False)),
        PREFETCH=bool(cfg.get("PREFETCH", False)),
        FROM_LOGITS=logits is not None,
        ROUND=round_code(h.dtype),
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 1),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
    )
    return out


def _routing_operands(
    ids: torch.Tensor | None,
    weights: torch.Tensor | None,
    logits: torch.Tensor | None,
    top_k: int | None,
    num_experts: int,
) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """((the kernels' ids_ptr and topk_w_ptr operands), k): the top-k [T, k], or the router logits twice
    (the weights' operand is then unused) with ``top_k``."""
    if logits is None:
        if ids is None:
            raise ValueError("the pairs kernels need topk_ids (and topk_weights for gate_up) or logits")
        return (ids, weights if weights is not None else ids), ids.shape[1]
    if ids is not None or weights is not None or top_k is None:
        raise ValueError("with logits, pass top_k and no topk_ids / topk_weights")
    ep = triton.next_power_of_2(num_experts)
    if (
        logits.dtype != torch.float32
        or logits.stride(-1) != 1
        or logits.shape[-1] != ep
        or logits.stride(0) != ep
    ):
        raise ValueError(f"logits must be the fused router's [TP, {ep}] fp32 (row stride {ep})")
    return (logits, logits), top_k
