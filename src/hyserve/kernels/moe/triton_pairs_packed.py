"""The few-token MoE kernels (``triton_pairs.py``) over experts in the 12-bit bf16 format (``kernels/packed_bf16``).

At batch 1 the experts' gate_up streams 9 x 4 MB a layer (8 routed experts and the shared one) and is bound by
those bytes; the packed copy holds the same values in 0.75 of them. One program column per (token, expert)
pair and its end (the pre-norm's rstd, the routing weight, the shared expert's gate, ``h = silu(g) u w``) are
those of ``_gate_up_pairs_kernel`` (``_gate_up_finish``); the K loop is the packed GEMV's
(``kernels/linear/triton_packed.py``): a [BLOCK_I rows, groups] tile of 8-element groups, a group a thread
(BLOCK_I * BLOCK_K = 256 x num_warps keeps every load in one layout), the weights two tiles ahead, x (and the
norm weight) in the same groups, then the escapes of the program's gate and up rows.

The routed experts are one packed matrix [E * 2I, H] (expert e's gate rows at e * 2I, its up rows I after),
the shared expert another [2I, H]. Options: NORM_X (x before the block's pre-norm, as ``gate_up_pairs``'s
norm_weight: the routed projections' path) and L2PF (the first programs prefetch the shared expert's packed
bytes into L2 before the PDL wait, ``kernels/l2_prefetch.py``).

The down kernel takes one row of H a program across the k experts' down rows ([KP slots, groups] tiles, the h
rows of the pairs in the same groups: no row is shared, so no broadcast tile) plus the shared expert's row,
the ids and the first two tiles before the PDL wait. ``PackedExperts`` / ``pack_experts`` make a layer's copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hyserve.kernels import pdl
from hyserve.kernels.contracts import require
from hyserve.kernels.l2_prefetch import prefetch_l2, prefetch_parts
from hyserve.kernels.moe.routing import round_code
from hyserve.kernels.moe.triton_pairs import _gate_up_finish
from hyserve.kernels.moe.workspace import empty, launch
from hyserve.kernels.packed_bf16 import PackedBF16, pack_bf16
from hyserve.kernels.packed_bf16.triton_kernel import (
    advance_groups,
    decode_group,
    escape_deltas,
    escape_entries,
    escape_sum,
    group_ptrs,
    group_values,
)
from hyserve.kernels.pdl import wait_for_previous


@triton.jit
def _rows_escapes(eptr_ptr, erow_ptr, ecol_ptr, eval_ptr, base_ptr, row0, rows, x_row, nw_ptr, first: tl.constexpr,
                  ESCAPES: tl.constexpr, NORM_X: tl.constexpr):  # fmt: skip
    """[BLOCK_I]: the escapes' corrections to x W^T for the rows row0 + [0, BLOCK_I) (rows [BLOCK_I], their
    ids; x times 1 + nw with NORM_X): the first ESCAPES entries (first=True: taken before the K loop, so their
    loads overlap the weight stream), or all the others (first=False, after it: a loop, rarely entered)."""
    p_start = tl.load(eptr_ptr + row0)
    p_end = tl.load(eptr_ptr + row0 + rows.shape[0])
    x_rows = x_row + tl.zeros((1, 1), dtype=tl.int32)
    one = tl.full((1,), 1, dtype=tl.int1)
    if first:
        erow, ecol, delta = escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p_start, p_end, ESCAPES)
        esc = escape_sum(erow, ecol, delta, x_rows, nw_ptr, rows, one, 0, 1, NORM_X, False)
    else:
        esc = tl.zeros((1, rows.shape[0]), dtype=tl.float32)
        for p0 in range(p_start + ESCAPES, p_end, ESCAPES):
            erow, ecol, delta = escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p0, p_end, ESCAPES)
            esc += escape_sum(erow, ecol, delta, x_rows, nw_ptr, rows, one, 0, 1, NORM_X, False)
    return tl.sum(esc, axis=0)


@triton.jit
def _gate_up_pairs_packed_kernel(
    x_ptr,
    low_ptr,
    nib_ptr,
    base_ptr,
    eptr_ptr,
    erow_ptr,
    ecol_ptr,
    eval_ptr,
    s_low_ptr,
    s_nib_ptr,
    s_base_ptr,
    s_eptr_ptr,
    s_erow_ptr,
    s_ecol_ptr,
    s_eval_ptr,
    sg_ptr,
    ids_ptr,
    topk_w_ptr,
    h_ptr,
    nw_ptr,
    eps,
    T,
    H,
    I,
    stride_xt,
    s_low_bytes,
    s_nib_bytes,
    K_TOP: tl.constexpr,
    KP: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ESCAPES: tl.constexpr,
    HAS_SHARED_GATE: tl.constexpr,
    NORM_X: tl.constexpr,
    ROUND: tl.constexpr,
    L2PF: tl.constexpr,
    ASM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(I, BLOCK_I), T*k + T (with a shared expert) or T*k). The s_* operands: the shared expert's
    packed [2I, H] (the routed experts' again without one; s_*_bytes its sizes, the L2PF range). H and
    BLOCK_K multiples of 8, I of BLOCK_I."""
    BG: tl.constexpr = BLOCK_K // 8
    n = tl.program_id(0)
    if L2PF > 0:
        lin = n + tl.num_programs(0) * tl.program_id(1)
        if lin < L2PF:
            prefetch_l2(s_low_ptr, s_low_bytes, lin, L2PF, 512)
            prefetch_l2(s_nib_ptr, s_nib_bytes, lin, L2PF, 512)
    wait_for_previous(USE_PDL)
    p = tl.program_id(1)
    N = T * K_TOP
    is_shared = p >= N
    pc = tl.minimum(p, N - 1)
    tok = tl.where(is_shared, p - N, p // K_TOP).to(tl.int64)
    e = tl.load(ids_ptr + pc).to(tl.int64)
    wrow = tl.load(topk_w_ptr + pc)  # NORM_X: unused (the weight comes from the raw logits at the end)
    # the pair's matrix: the shared expert's, or the routed experts' from expert e's first row on
    row0 = tl.where(is_shared, 0, e * (2 * I))
    low_p = tl.where(is_shared, s_low_ptr, low_ptr)
    nib_p = tl.where(is_shared, s_nib_ptr, nib_ptr)
    base_p = tl.where(is_shared, s_base_ptr, base_ptr)
    eptr_p = tl.where(is_shared, s_eptr_ptr, eptr_ptr)
    erow_p = tl.where(is_shared, s_erow_ptr, erow_ptr)
    ecol_p = tl.where(is_shared, s_ecol_ptr, ecol_ptr)
    eval_p = tl.where(is_shared, s_eval_ptr, eval_ptr)

    ii = n * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = ii < I
    rows_g = row0 + ii.to(tl.int64)
    rows_u = rows_g + I
    gg = tl.arange(0, BG)
    wmask = imask[:, None] & (gg < H // 8)[None, :]  # H % BLOCK_K == 0: every tile is whole
    nib_g = nib_p.to(tl.pointer_type(tl.uint32)) + rows_g[:, None] * (H // 8) + gg[None, :]
    nib_u = nib_p.to(tl.pointer_type(tl.uint32)) + rows_u[:, None] * (H // 8) + gg[None, :]
    low_g = low_p.to(tl.pointer_type(tl.uint64)) + rows_g[:, None] * (H // 8) + gg[None, :]
    low_u = low_p.to(tl.pointer_type(tl.uint64)) + rows_u[:, None] * (H // 8) + gg[None, :]
    base4_g = tl.load(base_p + rows_g, mask=imask, other=0).to(tl.uint32)[:, None] * 0x01010101
    base4_u = tl.load(base_p + rows_u, mask=imask, other=0).to(tl.uint32)[:, None] * 0x01010101
    # x and the norm weight as [1, groups]: the layout of one row of the weight tiles, broadcast over the rows
    # in registers (a [BLOCK_I, groups] pointer tile with a zero row stride took a layout of its own, and every
    # product went through shared memory)
    x_ptrs = group_ptrs(x_ptr, tok * (stride_xt // 2) + 4 * gg[None, :].to(tl.int64))
    nw_ptrs = group_ptrs(nw_ptr, 4 * gg[None, :].to(tl.int64))
    gmask = (gg < H // 8)[None, :]

    # two tiles in flight ahead of the multiply (the last ones' loads masked off)
    ng = tl.load(nib_g, mask=wmask, other=0)
    lg = tl.load(low_g, mask=wmask, other=0)
    nu = tl.load(nib_u, mask=wmask, other=0)
    lu = tl.load(low_u, mask=wmask, other=0)
    more = wmask & (gg * 0 + BLOCK_K < H)[None, :]
    ng_next = tl.load(nib_g + BG, mask=more, other=0)
    lg_next = tl.load(low_g + BG, mask=more, other=0)
    nu_next = tl.load(nib_u + BG, mask=more, other=0)
    lu_next = tl.load(low_u + BG, mask=more, other=0)
    x_row = x_ptr + tok * stride_xt
    esc_g = _rows_escapes(eptr_p, erow_p, ecol_p, eval_p, base_p, row0 + n * BLOCK_I, rows_g, x_row, nw_ptr, True,
                          ESCAPES, NORM_X)  # fmt: skip
    esc_u = _rows_escapes(eptr_p, erow_p, ecol_p, eval_p, base_p, row0 + I + n * BLOCK_I, rows_u, x_row, nw_ptr,
                          True, ESCAPES, NORM_X)  # fmt: skip
    acc_g = tl.zeros((BLOCK_I, BG), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_I, BG), dtype=tl.float32)
    ss = tl.zeros((1, BG), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ahead = wmask & (gg * 0 + k0 + 2 * BLOCK_K < H)[None, :]
        ng_ahead = tl.load(nib_g + 2 * BG, mask=ahead, other=0)
        lg_ahead = tl.load(low_g + 2 * BG, mask=ahead, other=0)
        nu_ahead = tl.load(nib_u + 2 * BG, mask=ahead, other=0)
        lu_ahead = tl.load(low_u + 2 * BG, mask=ahead, other=0)
        wg = decode_group(ng, lg.to(tl.uint32), (lg >> 32).to(tl.uint32), base4_g, ASM)
        wu = decode_group(nu, lu.to(tl.uint32), (lu >> 32).to(tl.uint32), base4_u, ASM)
        x = group_values(x_ptrs, gmask)
        if NORM_X:
            nw = group_values(nw_ptrs, gmask)
            for j in tl.static_range(8):
                ss += x[j] * x[j]
                xj = x[j] * (1.0 + nw[j])
                acc_g += xj * wg[j]
                acc_u += xj * wu[j]
        else:
            for j in tl.static_range(8):
                acc_g += x[j] * wg[j]
                acc_u += x[j] * wu[j]
        ng, lg, nu, lu = ng_next, lg_next, nu_next, lu_next
        ng_next, lg_next, nu_next, lu_next = ng_ahead, lg_ahead, nu_ahead, lu_ahead
        nib_g += BG
        low_g += BG
        nib_u += BG
        low_u += BG
        x_ptrs = advance_groups(x_ptrs, BLOCK_K)
        nw_ptrs = advance_groups(nw_ptrs, BLOCK_K)
    esc_g += _rows_escapes(eptr_p, erow_p, ecol_p, eval_p, base_p, row0 + n * BLOCK_I, rows_g, x_row, nw_ptr,
                           False, ESCAPES, NORM_X)  # fmt: skip
    esc_u += _rows_escapes(eptr_p, erow_p, ecol_p, eval_p, base_p, row0 + I + n * BLOCK_I, rows_u, x_row, nw_ptr,
                           False, ESCAPES, NORM_X)  # fmt: skip
    g = tl.sum(acc_g, axis=1) + esc_g
    u = tl.sum(acc_u, axis=1) + esc_u
    _gate_up_finish(g, u, ss + tl.zeros((BLOCK_I, BG), dtype=tl.float32), wrow, is_shared, p, pc, tok, x_row, nw_ptr, sg_ptr, topk_w_ptr, h_ptr,
                    ii, imask, tl.arange(0, BLOCK_K), eps, H, I, K_TOP, KP, ROUND, HAS_SHARED_GATE, NORM_X, False,
                    USE_PDL)  # fmt: skip


def gate_up_pairs_packed(
    x: torch.Tensor,
    packed: PackedBF16,
    inter: int,
    shared_packed: PackedBF16 | None,
    shared_expert_gate: torch.Tensor | None,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    cfg: dict,
    h: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
) -> torch.Tensor:
    """``gate_up_pairs`` (all pairs in one launch, given top-k ids and weights, or with ``norm_weight`` the raw
    top-k logits) with the routed experts' gate_up packed as one [E * 2I, H] matrix (I = ``inter``) and the
    shared expert's as [2I, H] -> h [T*k + T, I]. cfg: BLOCK_I, BLOCK_K (BLOCK_I * BLOCK_K = 256 x num_warps keeps the loads in one
    layout), num_warps, ESCAPES (default 16), L2PF (as ``gate_up_pairs``), maxnreg."""
    T, H = x.shape
    k_top = topk_ids.shape[1]
    rows, _ = packed.shape
    require(
        packed.shape[1] == H and rows % (2 * inter) == 0 and H % cfg["BLOCK_K"] == 0 and H % 8 == 0,
        "gate_up_pairs_packed: the packed experts must be [E * 2I, H] with H a multiple of BLOCK_K and of 8",
    )
    require(inter % cfg["BLOCK_I"] == 0, "gate_up_pairs_packed: I must be a multiple of BLOCK_I")
    require(
        shared_packed is None or shared_packed.shape == (2 * inter, H),
        "gate_up_pairs_packed: the shared expert must be [2I, H] (fold a wider one in elsewhere)",
    )
    require(
        x.dtype != torch.bfloat16 or (x.data_ptr() % 8 == 0 and x.stride(0) % 4 == 0 and x.stride(1) == 1),
        "gate_up_pairs_packed: bf16 x must be 8-byte aligned with unit column and 4-element row strides",
    )
    has_shared = shared_packed is not None
    if h is None:
        h = empty((T * k_top + T, inter), x.dtype, x.device)
    sp = shared_packed if has_shared else packed
    sg = shared_expert_gate if shared_expert_gate is not None else x
    count = T * k_top + (T if has_shared else 0)
    launch(
        _gate_up_pairs_packed_kernel,
        (inter // cfg["BLOCK_I"], count),
        x,
        *packed.operands,
        *sp.operands,
        sg,
        topk_ids,
        topk_weights,
        h,
        norm_weight if norm_weight is not None else x,
        norm_eps,
        T,
        H,
        inter,
        x.stride(0),
        sp.low.numel(),
        sp.nib.numel(),
        K_TOP=k_top,
        KP=triton.next_power_of_2(k_top),
        BLOCK_I=cfg["BLOCK_I"],
        BLOCK_K=cfg["BLOCK_K"],
        ESCAPES=int(cfg.get("ESCAPES", 16)),
        HAS_SHARED_GATE=has_shared and shared_expert_gate is not None,
        NORM_X=norm_weight is not None,
        ROUND=round_code(x.dtype),
        L2PF=prefetch_parts(cfg, pdl.enabled(x)) if has_shared else 0,
        ASM=x.is_cuda,
        num_warps=cfg.get("num_warps", 4),
        num_stages=1,
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
    )
    return h


@triton.jit
def _slot_escapes(eptr_ptr, ecol_ptr, eval_ptr, base_ptr, rows, h_rows, sm, c0, NE: tl.constexpr):
    """sum over slots j (rows [KP] of the packed matrix, one a slot; h_rows [KP] their h rows; sm [KP] the
    slots in use) of the escapes c0 .. c0 + NE of row j times h[j, col] (a [KP, NE] gather)."""
    p_start = tl.load(eptr_ptr + rows, mask=sm, other=0)
    p_end = tl.load(eptr_ptr + rows + 1, mask=sm, other=0)
    p = p_start[:, None] + c0 + tl.arange(0, NE)[None, :]
    pm = sm[:, None] & (p < p_end[:, None])
    col = tl.load(ecol_ptr + p, mask=pm, other=0)
    val = tl.load(eval_ptr + p, mask=pm, other=0.0)
    base = tl.load(base_ptr + rows, mask=sm, other=0)
    delta = tl.where(pm, escape_deltas(val, base[:, None] + tl.zeros_like(col)), 0.0)
    hv = tl.load(h_rows[:, None] + col, mask=pm, other=0.0).to(tl.float32)
    return tl.sum(tl.sum(delta * hv, axis=1), axis=0)


@triton.jit
def _slot_escape_count(eptr_ptr, rows, sm):
    """The most escapes any of the slots' rows has."""
    p_start = tl.load(eptr_ptr + rows, mask=sm, other=0)
    p_end = tl.load(eptr_ptr + rows + 1, mask=sm, other=0)
    return tl.max(p_end - p_start, axis=0)


@triton.jit
def _down_pairs_packed_kernel(
    h_ptr,
    low_ptr,
    nib_ptr,
    base_ptr,
    eptr_ptr,
    erow_ptr,
    ecol_ptr,
    eval_ptr,
    s_low_ptr,
    s_nib_ptr,
    s_base_ptr,
    s_eptr_ptr,
    s_erow_ptr,
    s_ecol_ptr,
    s_eval_ptr,
    ids_ptr,
    out_ptr,
    T,
    H,
    I,
    stride_ot,
    K_TOP: tl.constexpr,
    KP: tl.constexpr,
    BLOCK_I: tl.constexpr,
    ESCAPES: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    ADD_OUT: tl.constexpr,
    ASM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (H, T): program (hh, t) takes row hh of the k experts' down matrices (rows e_j * H + hh of the packed
    [E * H, I]; KP slots, K_TOP used) and of the shared expert's [H, I], over I in [KP, BLOCK_I / 8 groups]
    tiles (one group a thread at KP * BLOCK_I = 256 x num_warps), against the pairs' h rows in the same groups:
    out[t, hh] = sum_j h[t*k + j] . W_down[e_j][hh] + h[T*k + t] . shared_down[hh] (+ out with ADD_OUT). The
    ids (two launches back) and the first two tiles load before the PDL wait, h after it. The operands are
    ``PackedBF16.operands`` twice; erow_ptr and s_erow_ptr go unused (a slot's escapes are all of one row)."""
    BG: tl.constexpr = BLOCK_I // 8
    hh = tl.program_id(0)
    t = tl.program_id(1)
    N = T * K_TOP
    j = tl.arange(0, KP)
    sm = j < K_TOP
    e = tl.load(ids_ptr + t * K_TOP + j, mask=sm, other=0).to(tl.int64)
    rows = e * H + hh  # [KP]
    gg = tl.arange(0, BG)
    wmask = sm[:, None] & (gg < I // 8)[None, :]
    nib_p = nib_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None] * (I // 8) + gg[None, :]
    low_p = low_ptr.to(tl.pointer_type(tl.uint64)) + rows[:, None] * (I // 8) + gg[None, :]
    base4 = tl.load(base_ptr + rows, mask=sm, other=0).to(tl.uint32)[:, None] * 0x01010101
    nib = tl.load(nib_p, mask=wmask, other=0)
    low = tl.load(low_p, mask=wmask, other=0)
    more = wmask & (gg * 0 + BLOCK_I < I)[None, :]
    nib_next = tl.load(nib_p + BG, mask=more, other=0)
    low_next = tl.load(low_p + BG, mask=more, other=0)
    # the shared expert's row hh: a [1, groups] tile of its own
    s_row = tl.zeros((1,), dtype=tl.int64) + hh
    s_mask = (gg < I // 8)[None, :]
    s_nib_p = s_nib_ptr.to(tl.pointer_type(tl.uint32)) + s_row[:, None] * (I // 8) + gg[None, :]
    s_low_p = s_low_ptr.to(tl.pointer_type(tl.uint64)) + s_row[:, None] * (I // 8) + gg[None, :]
    if HAS_SHARED:
        s_base4 = tl.load(s_base_ptr + s_row).to(tl.uint32)[:, None] * 0x01010101
        s_nib = tl.load(s_nib_p, mask=s_mask, other=0)
        s_low = tl.load(s_low_p, mask=s_mask, other=0)
    wait_for_previous(USE_PDL)
    h_rows = h_ptr + (t * K_TOP + j).to(tl.int64) * I  # [KP]
    hs_row = h_ptr + (N + t).to(tl.int64) * I
    h_ptrs = group_ptrs(h_ptr, (t * K_TOP + j).to(tl.int64)[:, None] * (I // 2) + 4 * gg[None, :])
    hs_ptrs = group_ptrs(h_ptr, (N + t).to(tl.int64) * (I // 2) + 4 * gg[None, :].to(tl.int64))
    esc = _slot_escapes(eptr_ptr, ecol_ptr, eval_ptr, base_ptr, rows, h_rows, sm, 0, ESCAPES)
    if HAS_SHARED:
        s_one = s_row * 0 == 0
        esc += _slot_escapes(s_eptr_ptr, s_ecol_ptr, s_eval_ptr, s_base_ptr, s_row,
                             hs_row + s_row * 0, s_one, 0, ESCAPES)  # fmt: skip
    acc = tl.zeros((KP, BG), dtype=tl.float32)
    acc_s = tl.zeros((1, BG), dtype=tl.float32)
    for i0 in range(0, I, BLOCK_I):
        ahead = wmask & (gg * 0 + i0 + 2 * BLOCK_I < I)[None, :]
        nib_ahead = tl.load(nib_p + 2 * BG, mask=ahead, other=0)
        low_ahead = tl.load(low_p + 2 * BG, mask=ahead, other=0)
        w = decode_group(nib, low.to(tl.uint32), (low >> 32).to(tl.uint32), base4, ASM)
        hv = group_values(h_ptrs, wmask)
        for q in tl.static_range(8):
            acc += hv[q] * w[q]
        if HAS_SHARED:
            ws = decode_group(s_nib, s_low.to(tl.uint32), (s_low >> 32).to(tl.uint32), s_base4, ASM)
            hs = group_values(hs_ptrs, s_mask)
            for q in tl.static_range(8):
                acc_s += hs[q] * ws[q]
            s_nib_p += BG
            s_low_p += BG
            s_more = s_mask & (gg * 0 + i0 + BLOCK_I < I)[None, :]
            s_nib = tl.load(s_nib_p, mask=s_more, other=0)
            s_low = tl.load(s_low_p, mask=s_more, other=0)
            hs_ptrs = advance_groups(hs_ptrs, BLOCK_I)
        nib, low, nib_next, low_next = nib_next, low_next, nib_ahead, low_ahead
        nib_p += BG
        low_p += BG
        h_ptrs = advance_groups(h_ptrs, BLOCK_I)
    # rows with more escapes than one load of them (rare)
    for c0 in range(ESCAPES, _slot_escape_count(eptr_ptr, rows, sm), ESCAPES):
        esc += _slot_escapes(eptr_ptr, ecol_ptr, eval_ptr, base_ptr, rows, h_rows, sm, c0, ESCAPES)
    if HAS_SHARED:
        s_one = s_row * 0 == 0
        for c0 in range(ESCAPES, _slot_escape_count(s_eptr_ptr, s_row, s_one), ESCAPES):
            esc += _slot_escapes(s_eptr_ptr, s_ecol_ptr, s_eval_ptr, s_base_ptr, s_row,
                                 hs_row + s_row * 0, s_one, c0, ESCAPES)  # fmt: skip
    y = tl.sum(tl.sum(acc, axis=1), axis=0) + tl.sum(tl.sum(acc_s, axis=1), axis=0) + esc
    o_ptr = out_ptr + t.to(tl.int64) * stride_ot + hh
    if ADD_OUT:  # out is the residual stream: out += the MoE output, in fp32 before the one cast
        y += tl.load(o_ptr).to(tl.float32)
    tl.store(o_ptr, y.to(out_ptr.dtype.element_ty))


def down_pairs_packed(
    h: torch.Tensor,
    packed: PackedBF16,
    shared_packed: PackedBF16 | None,
    topk_ids: torch.Tensor,
    cfg: dict,
    out: torch.Tensor | None = None,
    add_out: bool = False,
) -> torch.Tensor:
    """``down_pairs`` (given top-k ids) with the routed experts' down matrices packed as one [E * H, I] and the
    shared expert's as [H, I]: h [T*k + T, I] -> out [T, H] (with ``add_out``, added to out's contents). cfg:
    BLOCK_I (a multiple of 8 dividing I; one group a thread at KP * BLOCK_I = 256 x num_warps), num_warps,
    ESCAPES (escapes a slot's row loads at once, default 4), maxnreg."""
    k_top = topk_ids.shape[1]
    T = h.shape[0] // (k_top + 1)
    inter = h.shape[1]
    rows = packed.shape[0]
    H = shared_packed.shape[0] if shared_packed is not None else cfg.get("H")
    require(H is not None and rows % H == 0, "down_pairs_packed: the packed experts must be [E * H, I]")
    require(
        packed.shape[1] == inter and inter % cfg["BLOCK_I"] == 0 and cfg["BLOCK_I"] % 8 == 0,
        "down_pairs_packed: BLOCK_I must be a multiple of 8 dividing I",
    )
    require(
        h.dtype != torch.bfloat16 or (h.data_ptr() % 8 == 0 and inter % 4 == 0 and h.is_contiguous()),
        "down_pairs_packed: bf16 h must be contiguous and 8-byte aligned",
    )
    if out is None:
        out = torch.empty((T, H), dtype=h.dtype, device=h.device)
    sp = shared_packed if shared_packed is not None else packed
    launch(
        _down_pairs_packed_kernel,
        (H, T),
        h,
        *packed.operands,
        *sp.operands,
        topk_ids,
        out,
        T,
        H,
        inter,
        out.stride(0),
        K_TOP=k_top,
        KP=triton.next_power_of_2(k_top),
        BLOCK_I=cfg["BLOCK_I"],
        ESCAPES=int(cfg.get("ESCAPES", 4)),
        HAS_SHARED=shared_packed is not None,
        ADD_OUT=add_out,
        ASM=h.is_cuda,
        num_warps=cfg.get("num_warps", 4),
        num_stages=1,
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
    )
    return out


@dataclass(frozen=True)
class PackedExperts:
    """One MoE layer's experts in the 12-bit format, for the few-token kernels (``pack_experts``)."""

    gate_up: PackedBF16  # [E * 2I, H]: expert e's gate rows at e * 2I, its up rows I after
    down: PackedBF16  # [E * H, I]
    shared_gate_up: PackedBF16 | None  # [2I, H] (a shared expert as wide as the routed ones), else None
    shared_down: PackedBF16 | None  # [H, I]
    inter: int  # I

    @property
    def nbytes(self) -> int:
        parts = (self.gate_up, self.down, self.shared_gate_up, self.shared_down)
        return sum(p.nbytes for p in parts if p is not None)


def pack_experts(
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    shared_gate_up: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
) -> PackedExperts:
    """w_gate_up [E, 2I, H], w_down [E, H, I] (bf16) and the shared expert's [2I, H], [H, I] (packed only when as
    wide as the routed ones, which is when the kernels fold it in) -> their ``PackedExperts``."""
    E, two_i, H = w_gate_up.shape
    inter = two_i // 2
    fold = (
        shared_gate_up is not None and shared_gate_up.shape == (two_i, H) and shared_down.shape == (H, inter)
    )
    return PackedExperts(
        gate_up=pack_bf16(w_gate_up.reshape(E * two_i, H)),
        down=pack_bf16(w_down.reshape(E * H, inter)),
        shared_gate_up=pack_bf16(shared_gate_up) if fold else None,
        shared_down=pack_bf16(shared_down) if fold else None,
        inter=inter,
    )
