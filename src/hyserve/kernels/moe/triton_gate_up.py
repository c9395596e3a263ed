"""Grouped gate/up projection with the SwiGLU and the routing weight fused in the epilogue.

Shapes: x [T, H]; w_gate_up [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up, H contiguous); shared expert
shared_gate_up [2I, H] (same I) as "expert E"; shared_expert_gate [1, H] or none. Output
h [N + T, I] in x's dtype, one row per routing row (see ``routing.py``: rows < N are the pairs in
expert-sorted order, row N + t is token t of the shared expert):

    h[r] = w_r * silu(x[t_r] @ W_gate[e_r].T) * (x[t_r] @ W_up[e_r].T)

with w_r the pair's routing weight, or sigmoid(x[t] . shared_expert_gate) for the shared expert (so
the down projection needs no per-row scale and the output reduction is a plain sum).

Grid (cdiv(I, BLOCK_I), MAXB): program (n, b) takes block b (up to BLOCK_M rows of one expert, token
ids gathered through ``sorted_pairs``) and the intermediate columns [n*BLOCK_I, (n+1)*BLOCK_I): it loads
the gate rows *and* the matching up rows of the same columns, so silu(gate)*up is local; the full K=H
reduction stays in the program (no split-K), so every weight byte is read once per block and the
result is deterministic. Programs with b >= the number of blocks exit at once (the grid depends on T
only: CUDA-graph safe). n is the fastest grid axis: the N-tiles of one block run back to back, so its
gathered x rows are read from HBM once, and consecutive blocks of one expert share its weight tiles
in L2. Each expert's weights are read once per step as long as its rows fit in one
block (decode: BLOCK_M >= tokens per expert almost always).

USE_DOT (BLOCK_M >= 16): tensor-core ``tl.dot`` on [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_I] tiles, fp32
accumulation (the prefill path and batched decode). USE_DOT False (BLOCK_M < 16, e.g. 1 at T=1): a
GEMV-style broadcast-multiply-reduce on [BLOCK_M, BLOCK_I, BLOCK_K] registers, no tensor cores.

With the cfg's ``TMA`` (tensor-core path only) the weight tiles stream through Hopper tensor descriptors
(``[E*2I, H]`` and the shared expert's ``[2I, H]``, [BLOCK_I, BLOCK_K] boxes) in a K loop pipelined
``num_stages`` deep, instead of per-element pointer loads; x rows are still gathered by pointer. A box that
runs past its expert's gate (or up) rows reads neighbouring rows, whose results are never stored; past H or
the tensor's end the copy is zero-filled.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels import pdl, tma
from hyserve.kernels.contracts import require
from hyserve.kernels.l2_prefetch import prefetch_l2, prefetch_parts
from hyserve.kernels.moe.routing import block_rows
from hyserve.kernels.moe.workspace import empty, launch
from hyserve.kernels.pdl import wait_for_previous


@triton.jit
def _dot_tma(desc, row_g, row_u, acc_g, acc_u, x_rows, rmask, kk, H, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
             STAGES: tl.constexpr):  # fmt: skip
    """acc_g/u [BLOCK_M, BLOCK_I] += x rows [BLOCK_M, H] @ the descriptor's rows [row_g, +BLOCK_I) / [row_u,
    +BLOCK_I) transposed, over K = H, the copies pipelined STAGES deep."""
    for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):
        k = k0 + kk
        xt = tl.load(x_rows[:, None] + k[None, :], mask=rmask[:, None] & (k[None, :] < H), other=0.0)
        wg = desc.load([row_g, k0])
        wu = desc.load([row_u, k0])
        acc_g = tl.dot(xt, wg.T, acc_g, input_precision=DOT_PREC)
        acc_u = tl.dot(xt, wu.T, acc_u, input_precision=DOT_PREC)
    return acc_g, acc_u


@triton.jit(do_not_specialize=["N", "MAXB"])
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    sw_ptr,
    w_desc,
    sw_desc,
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
    stride_we,
    stride_wn,
    stride_sn,
    K_TOP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_I: tl.constexpr,
    HAS_SHARED_GATE: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_PREC: tl.constexpr,
    TMA: tl.constexpr,
    STAGES: tl.constexpr,
    W_EVICT: tl.constexpr,
    H_EVICT: tl.constexpr,
    pf_shared_bytes,
    pf_routed_bytes,
    L2PF: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """w_desc, sw_desc: the routed and the shared experts' [BLOCK_I, BLOCK_K] descriptors when TMA (else
    unused). W_EVICT, H_EVICT: the L2 eviction policy of the pointer-loaded weight tiles and of the h stores
    ("" or "evict_first" / "evict_last", the cfg's ``EVICT``). L2PF > 0: the first L2PF programs, resident
    while the routing's last kernel runs (PDL), prefetch into L2 the weights the first blocks read, which need
    no routing: the shared expert's pf_shared_bytes and the first routed experts' pf_routed_bytes."""
    if L2PF > 0:
        lin = tl.program_id(0) + tl.num_programs(0) * tl.program_id(1)
        if lin < L2PF:
            prefetch_l2(sw_ptr, pf_shared_bytes, lin, L2PF, 512)
            prefetch_l2(w_ptr, pf_routed_bytes, lin, L2PF, 512)
    wait_for_previous(USE_PDL)
    n = tl.program_id(0)  # fastest: the N-tiles of a block run back to back (its x / h rows stay in L2)
    b = tl.program_id(1)
    if b >= tl.load(meta_ptr + 3 * MAXB):
        return
    e, is_shared, pos, rmask, routed, pair = block_rows(meta_ptr, sorted_ptr, b, N, E, MAXB, BLOCK_M)
    tok = tl.where(pos >= N, pos - N, pair // K_TOP)
    tok = tl.where(rmask, tok, 0).to(tl.int64)
    wrow = tl.load(topk_w_ptr + pair, mask=routed, other=1.0)

    wbase = tl.where(is_shared, sw_ptr, w_ptr + e.to(tl.int64) * stride_we)
    stride_n = tl.where(is_shared, stride_sn, stride_wn)

    ii = n * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = ii < I
    kk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + tok * stride_xt
    g_rows = wbase + ii.to(tl.int64) * stride_n
    u_rows = wbase + (ii + I).to(tl.int64) * stride_n

    if USE_DOT and TMA:
        acc_g = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        if is_shared:
            acc_g, acc_u = _dot_tma(sw_desc, n * BLOCK_I, I + n * BLOCK_I, acc_g, acc_u, x_rows, rmask, kk, H,
                                    BLOCK_K, DOT_PREC, STAGES)  # fmt: skip
        else:
            row = e.to(tl.int32) * (2 * I) + n * BLOCK_I
            acc_g, acc_u = _dot_tma(w_desc, row, row + I, acc_g, acc_u, x_rows, rmask, kk, H, BLOCK_K, DOT_PREC,
                                    STAGES)  # fmt: skip
    elif USE_DOT:
        acc_g = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + kk
            xt = tl.load(x_rows[:, None] + k[None, :], mask=rmask[:, None] & (k[None, :] < H), other=0.0)
            if EVEN_K and EVEN_I:
                wg = tl.load(g_rows[None, :] + k[:, None], eviction_policy=W_EVICT)
                wu = tl.load(u_rows[None, :] + k[:, None], eviction_policy=W_EVICT)
            else:
                wm = (k[:, None] < H) & imask[None, :]
                wg = tl.load(g_rows[None, :] + k[:, None], mask=wm, other=0.0, eviction_policy=W_EVICT)
                wu = tl.load(u_rows[None, :] + k[:, None], mask=wm, other=0.0, eviction_policy=W_EVICT)
            acc_g = tl.dot(xt, wg, acc_g, input_precision=DOT_PREC)
            acc_u = tl.dot(xt, wu, acc_u, input_precision=DOT_PREC)
    else:
        acc_g = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + kk
            xt = tl.load(x_rows[:, None] + k[None, :], mask=rmask[:, None] & (k[None, :] < H), other=0.0)
            xt = xt.to(tl.float32)[:, None, :]
            if EVEN_K and EVEN_I:
                wg = tl.load(g_rows[:, None] + k[None, :])
                wu = tl.load(u_rows[:, None] + k[None, :])
            else:
                wm = imask[:, None] & (k[None, :] < H)
                wg = tl.load(g_rows[:, None] + k[None, :], mask=wm, other=0.0)
                wu = tl.load(u_rows[:, None] + k[None, :], mask=wm, other=0.0)
            acc_g += tl.sum(xt * wg.to(tl.float32)[None, :, :], axis=2)
            acc_u += tl.sum(xt * wu.to(tl.float32)[None, :, :], axis=2)

    if HAS_SHARED_GATE:
        if is_shared:
            sacc = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                k = k0 + kk
                km = k < H
                xt = tl.load(x_rows[:, None] + k[None, :], mask=rmask[:, None] & km[None, :], other=0.0)
                sg = tl.load(sg_ptr + k, mask=km, other=0.0)
                sacc += tl.sum(xt.to(tl.float32) * sg.to(tl.float32)[None, :], axis=1)
            wrow = 1.0 / (1.0 + tl.exp(-sacc))

    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u * wrow[:, None]
    tl.store(
        h_ptr + pos[:, None].to(tl.int64) * I + ii[None, :],
        h.to(h_ptr.dtype.element_ty),
        mask=rmask[:, None] & imask[None, :],
        eviction_policy=H_EVICT,
    )


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs (the tests) take the exact fp32 dot; bf16/fp16 the tensor-core default."""
    return "ieee" if dtype == torch.float32 else "tf32"


def gate_up(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    shared_gate_up: torch.Tensor | None,
    shared_expert_gate: torch.Tensor | None,
    topk_weights: torch.Tensor,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    max_blocks: int,
    block_m: int,
    cfg: dict,
) -> torch.Tensor:
    """-> h [N + T, I] (see the module docstring). cfg: BLOCK_I, BLOCK_K, num_warps, num_stages, TMA
    (optional, block_m >= 16: the weights through tensor descriptors; ignored where none can be made), EVICT
    (optional: h stored "evict_last", so that the down kernel finds it in L2 behind the weight stream, and
    pointer-loaded weights "evict_first"), L2PF and L2PF_E (optional, with PDL on the GPU: L2PF programs
    prefetch the shared expert's and the first L2PF_E routed experts' weights into L2 during the routing; the
    blocks list the shared expert first, then the experts by id, so the first programs read those)."""
    T, H = x.shape
    E, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    k_top = topk_weights.shape[1]
    n = T * k_top
    require(
        w_gate_up.stride(2) == 1 and x.stride(1) == 1, "gate_up: w_gate_up and x need a contiguous last dim"
    )
    h = empty((n + T, inter), x.dtype, x.device)
    bi, bk = cfg["BLOCK_I"], cfg["BLOCK_K"]
    sw = shared_gate_up if shared_gate_up is not None else w_gate_up
    if shared_gate_up is not None:
        require(
            shared_gate_up.stride(1) == 1 and shared_gate_up.shape == (two_i, H),
            "gate_up: shared_gate_up must be [2I, H] (the routed experts' I) with a contiguous last dim",
        )
    sg = shared_expert_gate if shared_expert_gate is not None else x
    grid = (triton.cdiv(inter, bi), max_blocks)
    descs = tma.expert_descriptors(w_gate_up, sw, [bi, bk]) if cfg.get("TMA") and block_m >= 16 else None
    stages = cfg.get("num_stages", 3)
    l2pf = prefetch_parts(cfg, pdl.enabled(x)) if w_gate_up.is_contiguous() and sw.is_contiguous() else 0
    pf_shared = sw.numel() * sw.element_size() if l2pf and shared_gate_up is not None else 0
    pf_routed = (
        min(E, int(cfg.get("L2PF_E", 0))) * w_gate_up.stride(0) * w_gate_up.element_size() if l2pf else 0
    )
    launch(
        _gate_up_kernel,
        grid,
        x,
        w_gate_up,
        sw,
        *(descs or (w_gate_up, sw)),
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
        w_gate_up.stride(0),
        w_gate_up.stride(1),
        sw.stride(0),
        K_TOP=k_top,
        BLOCK_M=block_m,
        BLOCK_I=bi,
        BLOCK_K=bk,
        EVEN_K=H % bk == 0,
        EVEN_I=inter % bi == 0,
        HAS_SHARED_GATE=shared_expert_gate is not None and shared_gate_up is not None,
        USE_DOT=block_m >= 16,
        DOT_PREC=dot_precision(x.dtype),
        TMA=descs is not None,
        STAGES=stages,
        W_EVICT="evict_first" if cfg.get("EVICT") else "",
        H_EVICT="evict_last" if cfg.get("EVICT") else "",
        pf_shared_bytes=pf_shared,
        pf_routed_bytes=pf_routed,
        L2PF=l2pf,
        num_warps=cfg.get("num_warps", 4),
        num_stages=stages,
    )
    return h
