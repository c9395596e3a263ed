"""The grouped gate_up and down (``triton_gate_up.py``, ``triton_prefill.py``: the tensor-core paths) over experts
in the 12-bit bf16 format.

A prefill of 1024 tokens reads all 256 experts of every layer (64 GB in bf16, 16 of the ~26 ms of kernels at
the first token); the packed experts (``triton_pairs_packed.PackedExperts``) hold them in 0.75 of the bytes.
Grid, blocks (one expert's routing rows, gathered through ``sorted_pairs``), the SwiGLU and routing-weight
epilogue and the shared expert's gate are those of ``_gate_up_kernel``; per K tile the program loads its
[BLOCK_I rows, BLOCK_K / 8 groups] words of the gate and up rows, decodes them in registers
(``decode_group``: the 8 elements of each group as 8 [BLOCK_I, groups] tiles), joins them back into the
[BLOCK_I, BLOCK_K] tile in K order (``tl.join`` three deep, then a reshape inside each thread) and feeds
``tl.dot`` in x's dtype (the values are bf16, so the cast is exact). The decode is ~3 integer operations a
weight, shared by the BLOCK_M rows of the block. The escapes of the program's rows are added after the K loop
as ``(w - v') x[col]`` for every row of the block. The down kernel is ``_down_kernel``'s scatter to per-pair
rows the same way (no fused sum), then the same ``sum_rows``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require
from hyserve.kernels.moe.routing import block_rows
from hyserve.kernels.moe.triton_gate_up import dot_precision
from hyserve.kernels.moe.triton_pairs_packed import PackedExperts
from hyserve.kernels.moe.triton_prefill import sum_rows
from hyserve.kernels.moe.workspace import empty, launch
from hyserve.kernels.packed_bf16.triton_kernel import decode_group, escape_entries, escape_sum
from hyserve.kernels.pdl import wait_for_previous


@triton.jit
def _in_k_order(w):
    """The 8 decoded tiles w0..w7 [R, G] (element 8g + q in tile q) -> [R, 8G] in K order."""
    lo = tl.join(tl.join(w[0], w[1]), tl.join(w[2], w[3]))  # [R, G, b, a]: q = 2a + b
    hi = tl.join(tl.join(w[4], w[5]), tl.join(w[6], w[7]))
    both = tl.join(lo, hi)  # [R, G, b, a, c]: q = 4c + 2a + b
    both = tl.permute(both, (0, 1, 4, 3, 2))  # [R, G, c, a, b]: q = 4c + 2a + b, the last axes fastest
    return tl.reshape(both, (w[0].shape[0], w[0].shape[1] * 8))


@triton.jit
def _block_escapes(
    eptr_ptr, erow_ptr, ecol_ptr, eval_ptr, base_ptr, row0, rows, x_rows, rmask, ESCAPES: tl.constexpr
):
    """[BLOCK_M, BLOCK_I]: the escapes of the rows row0 + [0, BLOCK_I) (ids ``rows``) times the block's x rows
    (x_rows [BLOCK_M, 1], rmask [BLOCK_M])."""
    p_start = tl.load(eptr_ptr + row0)
    p_end = tl.load(eptr_ptr + row0 + rows.shape[0])
    esc = tl.zeros((x_rows.shape[0], rows.shape[0]), dtype=tl.float32)
    for p0 in range(p_start, p_end, ESCAPES):
        erow, ecol, delta = escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p0, p_end, ESCAPES)
        esc += escape_sum(erow, ecol, delta, x_rows, x_rows, rows, rmask, 0, 1, False, False)
    return esc


@triton.jit(do_not_specialize=["N", "MAXB"])
def _gate_up_packed_kernel(
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
    topk_w_ptr,
    sorted_ptr,
    meta_ptr,
    h_ptr,
    N,
    H,
    I,
    E,
    MAXB,
    stride_xt,
    K_TOP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ESCAPES: tl.constexpr,
    HAS_SHARED_GATE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    ASM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """H % BLOCK_K == 0, I % BLOCK_I == 0, BLOCK_M >= 16 (``gate_up_packed``)."""
    BG: tl.constexpr = BLOCK_K // 8
    wait_for_previous(USE_PDL)
    n = tl.program_id(0)
    b = tl.program_id(1)
    if b >= tl.load(meta_ptr + 3 * MAXB):
        return
    e, is_shared, pos, rmask, routed, pair = block_rows(meta_ptr, sorted_ptr, b, N, E, MAXB, BLOCK_M)
    tok = tl.where(pos >= N, pos - N, pair // K_TOP)
    tok = tl.where(rmask, tok, 0).to(tl.int64)
    wrow = tl.load(topk_w_ptr + pair, mask=routed, other=1.0)
    row0 = tl.where(is_shared, 0, e.to(tl.int64) * (2 * I))
    low_p = tl.where(is_shared, s_low_ptr, low_ptr)
    nib_p = tl.where(is_shared, s_nib_ptr, nib_ptr)
    base_p = tl.where(is_shared, s_base_ptr, base_ptr)

    ii = n * BLOCK_I + tl.arange(0, BLOCK_I)
    rows_g = row0 + ii.to(tl.int64)
    rows_u = rows_g + I
    gg = tl.arange(0, BG)
    kk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + tok * stride_xt
    nib_g = nib_p.to(tl.pointer_type(tl.uint32)) + rows_g[:, None] * (H // 8) + gg[None, :]
    nib_u = nib_p.to(tl.pointer_type(tl.uint32)) + rows_u[:, None] * (H // 8) + gg[None, :]
    low_g = low_p.to(tl.pointer_type(tl.uint64)) + rows_g[:, None] * (H // 8) + gg[None, :]
    low_u = low_p.to(tl.pointer_type(tl.uint64)) + rows_u[:, None] * (H // 8) + gg[None, :]
    base4_g = tl.load(base_p + rows_g).to(tl.uint32)[:, None] * 0x01010101
    base4_u = tl.load(base_p + rows_u).to(tl.uint32)[:, None] * 0x01010101
    acc_g = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    # the words go through registers (the decode), where Triton's pipeliner cannot stage them: the next tile's
    # are requested before this one's decode and dot
    ng = tl.load(nib_g)
    lg = tl.load(low_g)
    nu = tl.load(nib_u)
    lu = tl.load(low_u)
    for k0 in range(0, H, BLOCK_K):
        more = gg[None, :] * 0 + k0 + BLOCK_K < H
        ng_next = tl.load(nib_g + BG, mask=more, other=0)
        lg_next = tl.load(low_g + BG, mask=more, other=0)
        nu_next = tl.load(nib_u + BG, mask=more, other=0)
        lu_next = tl.load(low_u + BG, mask=more, other=0)
        xt = tl.load(x_rows[:, None] + (k0 + kk)[None, :], mask=rmask[:, None], other=0.0)
        wg = _in_k_order(decode_group(ng, lg.to(tl.uint32), (lg >> 32).to(tl.uint32), base4_g, ASM))
        wu = _in_k_order(decode_group(nu, lu.to(tl.uint32), (lu >> 32).to(tl.uint32), base4_u, ASM))
        acc_g = tl.dot(xt, tl.trans(wg.to(xt.dtype)), acc_g, input_precision=DOT_PREC)
        acc_u = tl.dot(xt, tl.trans(wu.to(xt.dtype)), acc_u, input_precision=DOT_PREC)
        ng, lg, nu, lu = ng_next, lg_next, nu_next, lu_next
        nib_g += BG
        low_g += BG
        nib_u += BG
        low_u += BG
    eptr_p = tl.where(is_shared, s_eptr_ptr, eptr_ptr)
    erow_p = tl.where(is_shared, s_erow_ptr, erow_ptr)
    ecol_p = tl.where(is_shared, s_ecol_ptr, ecol_ptr)
    eval_p = tl.where(is_shared, s_eval_ptr, eval_ptr)
    acc_g += _block_escapes(eptr_p, erow_p, ecol_p, eval_p, base_p, row0 + n * BLOCK_I, rows_g, x_rows[:, None],
                            rmask, ESCAPES)  # fmt: skip
    acc_u += _block_escapes(eptr_p, erow_p, ecol_p, eval_p, base_p, row0 + I + n * BLOCK_I, rows_u,
                            x_rows[:, None], rmask, ESCAPES)  # fmt: skip

    if HAS_SHARED_GATE:
        if is_shared:
            sacc = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                k = k0 + kk
                xt = tl.load(x_rows[:, None] + k[None, :], mask=rmask[:, None], other=0.0)
                sg = tl.load(sg_ptr + k)
                sacc += tl.sum(xt.to(tl.float32) * sg.to(tl.float32)[None, :], axis=1)
            wrow = 1.0 / (1.0 + tl.exp(-sacc))

    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u * wrow[:, None]
    tl.store(
        h_ptr + pos[:, None].to(tl.int64) * I + ii[None, :], h.to(h_ptr.dtype.element_ty), mask=rmask[:, None]
    )


def gate_up_packed(
    x: torch.Tensor,
    packed: PackedExperts,
    shared_expert_gate: torch.Tensor | None,
    topk_weights: torch.Tensor,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    max_blocks: int,
    block_m: int,
    cfg: dict,
) -> torch.Tensor:
    """``gate_up`` (the tensor-core path, block_m >= 16) with the experts' (and the shared expert's) gate_up
    in ``packed`` -> h [N + T, I]. cfg: BLOCK_I (dividing I), BLOCK_K (dividing H, a multiple of 8), num_warps,
    num_stages, ESCAPES (default 16)."""
    T, H = x.shape
    inter = packed.inter
    k_top = topk_weights.shape[1]
    n = T * k_top
    bi, bk = cfg["BLOCK_I"], cfg["BLOCK_K"]
    require(block_m >= 16, "gate_up_packed: the tensor-core path needs block_m >= 16")
    require(
        H % bk == 0 and bk % 8 == 0 and inter % bi == 0 and packed.gate_up.shape[1] == H,
        "gate_up_packed: BLOCK_K must divide H (a multiple of 8) and BLOCK_I divide I",
    )
    require(x.stride(1) == 1, "gate_up_packed: x needs a contiguous last dim")
    h = empty((n + T, inter), x.dtype, x.device)
    gu = packed.gate_up
    sp = packed.shared_gate_up if packed.shared_gate_up is not None else gu
    sg = shared_expert_gate if shared_expert_gate is not None else x
    E = gu.shape[0] // (2 * inter)
    launch(
        _gate_up_packed_kernel,
        (inter // bi, max_blocks),
        x,
        *gu.operands,
        *sp.operands,
        sg,
        topk_weights,
        sorted_pairs,
        meta,
        h,
        n,
        H,
        inter,
        E,
        max_blocks,
        x.stride(0),
        K_TOP=k_top,
        BLOCK_M=block_m,
        BLOCK_I=bi,
        BLOCK_K=bk,
        ESCAPES=int(cfg.get("ESCAPES", 16)),
        HAS_SHARED_GATE=shared_expert_gate is not None and packed.shared_gate_up is not None,
        DOT_PREC=dot_precision(x.dtype),
        ASM=x.is_cuda,
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 3),
    )
    return h


@triton.jit(do_not_specialize=["N", "MAXB"])
def _down_packed_kernel(
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
    sorted_ptr,
    meta_ptr,
    y_ptr,
    N,
    H,
    I,
    E,
    MAXB,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ESCAPES: tl.constexpr,
    DOT_PREC: tl.constexpr,
    ASM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """``_down_kernel`` of ``triton_prefill.py`` (no fused sum, no TMA) over the packed [E * H, I] and the
    shared expert's [H, I]: y[pair] = h[row] W_down[e]^T for the block's rows, the H-tile [n * BLOCK_H, +BLOCK_H).
    I % BLOCK_K == 0, H % BLOCK_H == 0."""
    BG: tl.constexpr = BLOCK_K // 8
    wait_for_previous(USE_PDL)
    n = tl.program_id(0)
    b = tl.program_id(1)
    if b >= tl.load(meta_ptr + 3 * MAXB):
        return
    e, is_shared, pos, rmask, routed, pair = block_rows(meta_ptr, sorted_ptr, b, N, E, MAXB, BLOCK_M)
    dest = tl.where(pos >= N, pos, pair).to(tl.int64)
    row0 = tl.where(is_shared, 0, e.to(tl.int64) * H)
    low_p = tl.where(is_shared, s_low_ptr, low_ptr)
    nib_p = tl.where(is_shared, s_nib_ptr, nib_ptr)
    base_p = tl.where(is_shared, s_base_ptr, base_ptr)
    hh = n * BLOCK_H + tl.arange(0, BLOCK_H)
    rows = row0 + hh.to(tl.int64)
    gg = tl.arange(0, BG)
    kk = tl.arange(0, BLOCK_K)
    h_rows = h_ptr + pos.to(tl.int64) * I
    nib_w = nib_p.to(tl.pointer_type(tl.uint32)) + rows[:, None] * (I // 8) + gg[None, :]
    low_w = low_p.to(tl.pointer_type(tl.uint64)) + rows[:, None] * (I // 8) + gg[None, :]
    base4 = tl.load(base_p + rows).to(tl.uint32)[:, None] * 0x01010101
    acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    nib = tl.load(nib_w)
    low = tl.load(low_w)
    for k0 in range(0, I, BLOCK_K):
        more = gg[None, :] * 0 + k0 + BLOCK_K < I
        nib_next = tl.load(nib_w + BG, mask=more, other=0)
        low_next = tl.load(low_w + BG, mask=more, other=0)
        ht = tl.load(h_rows[:, None] + (k0 + kk)[None, :], mask=rmask[:, None], other=0.0)
        w = _in_k_order(decode_group(nib, low.to(tl.uint32), (low >> 32).to(tl.uint32), base4, ASM))
        acc = tl.dot(ht, tl.trans(w.to(ht.dtype)), acc, input_precision=DOT_PREC)
        nib, low = nib_next, low_next
        nib_w += BG
        low_w += BG
    eptr_p = tl.where(is_shared, s_eptr_ptr, eptr_ptr)
    erow_p = tl.where(is_shared, s_erow_ptr, erow_ptr)
    ecol_p = tl.where(is_shared, s_ecol_ptr, ecol_ptr)
    eval_p = tl.where(is_shared, s_eval_ptr, eval_ptr)
    acc += _block_escapes(eptr_p, erow_p, ecol_p, eval_p, base_p, row0 + n * BLOCK_H, rows, h_rows[:, None], rmask,
                          ESCAPES)  # fmt: skip
    tl.store(y_ptr + dest[:, None] * H + hh[None, :], acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None])


def down_scatter_sum_packed(
    h: torch.Tensor,
    packed: PackedExperts,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    max_blocks: int,
    block_m: int,
    T: int,
    k_top: int,
    cfg: dict,
    out: torch.Tensor | None = None,
    add_out: bool = False,
) -> torch.Tensor:
    """``down_scatter_sum`` with the experts' (and the shared expert's) down in ``packed``: h [N + T, I] -> out
    [T, H] (added to out's contents with ``add_out``). cfg: BLOCK_H (dividing H), BLOCK_K (dividing I, a
    multiple of 8), num_warps, num_stages, ESCAPES (default 16)."""
    inter = packed.inter
    E = packed.gate_up.shape[0] // (2 * inter)
    H = packed.down.shape[0] // E
    bh, bk = cfg["BLOCK_H"], cfg["BLOCK_K"]
    require(block_m >= 16, "down_scatter_sum_packed: the tensor-core path needs block_m >= 16")
    require(
        H % bh == 0 and inter % bk == 0 and bk % 8 == 0 and h.shape[1] == inter and h.is_contiguous(),
        "down_scatter_sum_packed: BLOCK_H must divide H, BLOCK_K (a multiple of 8) divide I; h contiguous",
    )
    n = T * k_top
    dn = packed.down
    sp = packed.shared_down if packed.shared_down is not None else dn
    y = empty((n + T, H), h.dtype, h.device)
    if out is None:
        out = empty((T, H), h.dtype, h.device)
    launch(
        _down_packed_kernel,
        (H // bh, max_blocks),
        h,
        *dn.operands,
        *sp.operands,
        sorted_pairs,
        meta,
        y,
        n,
        H,
        inter,
        E,
        max_blocks,
        BLOCK_M=block_m,
        BLOCK_H=bh,
        BLOCK_K=bk,
        ESCAPES=int(cfg.get("ESCAPES", 16)),
        DOT_PREC=dot_precision(h.dtype),
        ASM=h.is_cuda,
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 3),
    )
    return sum_rows(y, out, T, k_top, packed.shared_down is not None, add_out)
