"""Prefill down projection (grouped GEMM, per-pair output rows) and the per-token sum over the k + 1 rows.

Shapes: h [N + T, I] (``triton_gate_up``, rows scaled by the routing weight), w_down [E, H, I],
shared_down [H, I] as "expert E". Intermediate y [N + T, H] in x's dtype, indexed by *pair*: row
t*k + j is token t's slot j, row N + t its shared-expert output, so the sum kernel reads k contiguous
rows per token (no inverse permutation, no atomics).

``_down_kernel`` grid (cdiv(H, BLOCK_H), MAXB) (H-tiles fastest: a block's h rows stay in L2): block b (<= BLOCK_M rows of one expert, contiguous in
h) times the [BLOCK_H, I] slice of its down weights, tensor-core dots with fp32 accumulation, rows
scattered to their pair index. Blocks past the block count exit at once. With the cfg's ``TMA`` the weight
tiles stream through tensor descriptors (``[E*H, I]`` and the shared ``[H, I]``, [BLOCK_H, BLOCK_K] boxes,
pipelined ``num_stages`` deep) instead of pointer loads.

``_sum_kernel`` grid (cdiv(T, BLOCK_T), cdiv(H, BLOCK_H)): out[t] = sum_j y[t*k + j] + y[N + t] in
fp32, in a fixed order (deterministic), cast to x's dtype. y is rounded to x's dtype like the
reference's expert outputs.

With ``fused_sum`` (the down cfg) the sum runs in the down kernel's tail instead of a launch of its own:
after storing its y tile a program takes one ticket per row from ``counters[token, H-tile]`` (acq_rel, after
a CTA barrier); the program that draws a row's last ticket (its token's k-th, or (k+1)-th with the shared
expert) sums that token's k + 1 rows of the H-tile in the same fixed order as ``_sum_kernel`` and resets
the counter. The output is bit-identical to the two-launch path. It is off in every plan: on the H200
(da8a110, docs/performance.md) the tail slowed the down kernel by more than the sum kernel took (a 1024-token
prefill: down 5.75 -> 6.90 ms over 40 layers against the sum's 0.57; 4096: 10.27 -> 14.49 against 2.11): every
program pays the ticket's round trip and the tail's registers (the y-store addresses spill at BLOCK_M 64).
Eager at T = 32 it won (0.145 -> 0.101 ms, mostly the launch saved); not timed inside a decode graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels import tma
from hyserve.kernels.contracts import require
from hyserve.kernels.moe.routing import block_rows
from hyserve.kernels.moe.triton_gate_up import dot_precision
from hyserve.kernels.moe.workspace import empty, launch
from hyserve.kernels.pdl import wait_for_previous
from hyserve.kernels.tickets import ticket_counters


@triton.jit
def _down_dot_tma(desc, row, acc, h_rows, rmask, kk, I, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
                  STAGES: tl.constexpr):  # fmt: skip
    """acc [BLOCK_M, BLOCK_H] += h rows [BLOCK_M, I] @ the descriptor's rows [row, +BLOCK_H) transposed, over
    K = I, the copies pipelined STAGES deep."""
    for k0 in tl.range(0, I, BLOCK_K, num_stages=STAGES):
        k = k0 + kk
        ht = tl.load(h_rows[:, None] + k[None, :], mask=rmask[:, None] & (k[None, :] < I), other=0.0)
        acc = tl.dot(ht, desc.load([row, k0]).T, acc, input_precision=DOT_PREC)
    return acc


@triton.jit(do_not_specialize=["N", "MAXB"])
def _down_kernel(
    h_ptr,
    w_ptr,
    sw_ptr,
    w_desc,
    sw_desc,
    sorted_ptr,
    meta_ptr,
    y_ptr,
    cnt_ptr,
    out_ptr,
    stride_ot,
    N,
    H,
    I,
    E,
    MAXB,
    stride_we,
    stride_wh,
    stride_sh,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN: tl.constexpr,
    DOT_PREC: tl.constexpr,
    FUSED_SUM: tl.constexpr,
    K_TOP: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    ADD_OUT: tl.constexpr,
    TMA: tl.constexpr,
    STAGES: tl.constexpr,
    W_EVICT: tl.constexpr,
    Y_EVICT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """w_desc, sw_desc: the routed and the shared experts' [BLOCK_H, BLOCK_K] descriptors when TMA (else
    unused). W_EVICT, Y_EVICT: the L2 eviction policy of the pointer-loaded weight tiles and of the y stores
    ("" or "evict_first" / "evict_last", the cfg's ``EVICT``)."""
    wait_for_previous(USE_PDL)
    n = tl.program_id(0)  # fastest: the H-tiles of a block run back to back (its h rows stay in L2)
    b = tl.program_id(1)
    if b >= tl.load(meta_ptr + 3 * MAXB):
        return
    e, is_shared, pos, rmask, routed, pair = block_rows(meta_ptr, sorted_ptr, b, N, E, MAXB, BLOCK_M)
    dest = tl.where(pos >= N, pos, pair).to(tl.int64)
    wbase = tl.where(is_shared, sw_ptr, w_ptr + e.to(tl.int64) * stride_we)
    stride_h = tl.where(is_shared, stride_sh, stride_wh)

    hh = n * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hh < H
    kk = tl.arange(0, BLOCK_K)
    h_rows = h_ptr + pos.to(tl.int64) * I
    w_rows = wbase + hh.to(tl.int64) * stride_h
    acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    if TMA:
        if is_shared:
            acc = _down_dot_tma(sw_desc, n * BLOCK_H, acc, h_rows, rmask, kk, I, BLOCK_K, DOT_PREC, STAGES)
        else:
            row = e.to(tl.int32) * H + n * BLOCK_H
            acc = _down_dot_tma(w_desc, row, acc, h_rows, rmask, kk, I, BLOCK_K, DOT_PREC, STAGES)
    else:
        for k0 in range(0, I, BLOCK_K):
            k = k0 + kk
            ht = tl.load(h_rows[:, None] + k[None, :], mask=rmask[:, None] & (k[None, :] < I), other=0.0)
            if EVEN:
                wt = tl.load(w_rows[None, :] + k[:, None], eviction_policy=W_EVICT)
            else:
                wmask = (k[:, None] < I) & hmask[None, :]
                wt = tl.load(w_rows[None, :] + k[:, None], mask=wmask, other=0.0, eviction_policy=W_EVICT)
            acc = tl.dot(ht, wt, acc, input_precision=DOT_PREC)
    tl.store(
        y_ptr + dest[:, None] * H + hh[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=rmask[:, None] & hmask[None, :],
        eviction_policy=Y_EVICT,
    )
    if FUSED_SUM:
        tok = tl.where(pos >= N, pos - N, pair // K_TOP)
        _sum_last(y_ptr, cnt_ptr, out_ptr, stride_ot, tok, rmask, n, N, H, tl.num_programs(0), BLOCK_H, K_TOP,
                  HAS_SHARED, ADD_OUT)  # fmt: skip


@triton.jit
def _sum_rows(y_ptr, out_ptr, stride_ot, t64, m, hh, N, H, K_TOP: tl.constexpr, HAS_SHARED: tl.constexpr,
              ADD_OUT: tl.constexpr, CACHE: tl.constexpr, EVICT: tl.constexpr):  # fmt: skip
    """out[t, hh] (+)= sum_j y[t*k + j, hh] + y[N + t, hh] for the rows t64 [R] under mask m [R, BH], in fp32
    in this order, then one cast; y read with the load cache modifier CACHE and eviction policy EVICT."""
    acc = tl.zeros(m.shape, dtype=tl.float32)
    for j in tl.static_range(K_TOP):
        y = tl.load(
            y_ptr + (t64 * K_TOP + j)[:, None] * H + hh[None, :],
            mask=m,
            other=0.0,
            cache_modifier=CACHE,
            eviction_policy=EVICT,
        )
        acc += y.to(tl.float32)
    if HAS_SHARED:
        y = tl.load(
            y_ptr + (N + t64)[:, None] * H + hh[None, :],
            mask=m,
            other=0.0,
            cache_modifier=CACHE,
            eviction_policy=EVICT,
        )
        acc += y.to(tl.float32)
    o_ptrs = out_ptr + t64[:, None] * stride_ot + hh[None, :]
    if ADD_OUT:  # out is the residual stream: out += the MoE output, in fp32 before the one cast
        acc += tl.load(o_ptrs, mask=m, other=0.0).to(tl.float32)
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _sum_last(y_ptr, cnt_ptr, out_ptr, stride_ot, tok, rmask, n, N, H, NH, BLOCK_H: tl.constexpr, K_TOP: tl.constexpr,
              HAS_SHARED: tl.constexpr, ADD_OUT: tl.constexpr):  # fmt: skip
    """The fused sum's tail of a down program: a ticket per row of its tile on counter [tok, n] (NH H-tiles a
    token); rows that draw their token's last ticket are summed (``_sum_rows``, SUB columns at a time: the
    whole [BLOCK_M, BLOCK_H] tile's pointers and sums spilled at BLOCK_M 64) and their counters reset."""
    tl.debug_barrier()  # every thread's y stores precede the releases below
    c_ptrs = cnt_ptr + tok.to(tl.int64) * NH + n
    old = tl.atomic_add(c_ptrs, 1, mask=rmask, sem="acq_rel", scope="gpu")
    last = rmask & (old == K_TOP + HAS_SHARED - 1)
    if tl.sum(last.to(tl.int32), axis=0) > 0:
        SUB: tl.constexpr = min(32, BLOCK_H)
        t64 = tok.to(tl.int64)
        for c in range(0, BLOCK_H, SUB):
            hh = n * BLOCK_H + c + tl.arange(0, SUB)
            m = last[:, None] & (hh < H)[None, :]
            _sum_rows(y_ptr, out_ptr, stride_ot, t64, m, hh, N, H, K_TOP, HAS_SHARED, ADD_OUT, ".cg", "")
        tl.store(c_ptrs, 0, mask=last)


@triton.jit(do_not_specialize=["T", "N"])
def _sum_kernel(
    y_ptr,
    out_ptr,
    T,
    N,
    H,
    stride_ot,
    K_TOP: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ADD_OUT: tl.constexpr,
    Y_EVICT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_previous(USE_PDL)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    hh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = (t < T)[:, None] & (hh < H)[None, :]
    _sum_rows(y_ptr, out_ptr, stride_ot, t.to(tl.int64), m, hh, N, H, K_TOP, HAS_SHARED, ADD_OUT, "", Y_EVICT)


def down_scatter_sum(
    h: torch.Tensor,
    w_down: torch.Tensor,
    shared_down: torch.Tensor | None,
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
    """h [N + T, I] -> out [T, H]; with ``add_out`` the result is added to out's contents (the residual
    stream). cfg: BLOCK_H, BLOCK_K, num_warps, num_stages; ``fused_sum`` (default False): the sum in the down
    kernel's tail (one launch) instead of ``_sum_kernel``; ``EVICT`` (optional): y stored "evict_last" and
    read by the sum "evict_first", pointer-loaded weights "evict_first", so that y waits in L2 behind the
    weight stream instead of going to HBM and back."""
    E, H, inter = w_down.shape
    require(w_down.stride(2) == 1, "the scatter down needs w_down with a contiguous last dim")
    require(block_m >= 16, "the scatter down needs block_m >= 16 (its tiles are tensor-core dots)")
    n = T * k_top
    has_shared = shared_down is not None
    sw = shared_down if has_shared else w_down
    if has_shared:
        require(
            shared_down.shape == (H, inter) and shared_down.stride(1) == 1,
            "the scatter down needs shared_down [H, I] (the routed experts' I) with a contiguous last dim",
        )
    y = empty((n + T, H), h.dtype, h.device)
    if out is None:
        out = empty((T, H), h.dtype, h.device)
    bh, bk = cfg["BLOCK_H"], cfg["BLOCK_K"]
    fused = bool(cfg.get("fused_sum", False))
    n_h = triton.cdiv(H, bh)
    # one counter per (token, H-tile), zero between launches; a first allocation of 2^18 covers T = 16384 at
    # BLOCK_H 128 (H = 2048), so the prefill graphs' capture never has to grow it
    counters = ticket_counters("moe down sum", h.device, T * n_h, minimum=1 << 18) if fused else y
    descs = tma.expert_descriptors(w_down, sw, [bh, bk]) if cfg.get("TMA") else None
    stages = cfg.get("num_stages", 3)
    launch(
        _down_kernel,
        (n_h, max_blocks),
        h,
        w_down,
        sw,
        *(descs or (w_down, sw)),
        sorted_pairs,
        meta,
        y,
        counters,
        out,
        out.stride(0),
        n,
        H,
        inter,
        E,
        max_blocks,
        w_down.stride(0),
        w_down.stride(1),
        sw.stride(0),
        BLOCK_M=block_m,
        BLOCK_H=bh,
        BLOCK_K=bk,
        EVEN=(inter % bk == 0) and (H % bh == 0),
        DOT_PREC=dot_precision(h.dtype),
        FUSED_SUM=fused,
        K_TOP=k_top,
        HAS_SHARED=has_shared,
        ADD_OUT=add_out,
        TMA=descs is not None,
        STAGES=stages,
        W_EVICT="evict_first" if cfg.get("EVICT") else "",
        Y_EVICT="evict_last" if cfg.get("EVICT") else "",
        num_warps=cfg.get("num_warps", 4),
        num_stages=stages,
    )
    if fused:
        return out
    return sum_rows(y, out, T, k_top, has_shared, add_out, evict=bool(cfg.get("EVICT")))


def sum_rows(
    y: torch.Tensor,
    out: torch.Tensor,
    T: int,
    k_top: int,
    has_shared: bool,
    add_out: bool,
    evict: bool = False,
) -> torch.Tensor:
    """out [T, H] (+)= the sum over each token's k (+ 1 shared) rows of the per-pair y [T*k + T, H]
    (``_sum_kernel``; ``evict``: y read "evict_first", its last use); returns out."""
    n, H = T * k_top, y.shape[1]
    # decode-sized T: one token and a quarter row per program, so even T = 32 fills the SMs (4 tokens x 1024
    # per program left 16 programs at T = 32: 7 us a layer on the H200 for 1 MB)
    big = T >= 512
    bt, bhs = (4, 1024) if big else (1, 256)
    bhs = min(bhs, triton.next_power_of_2(H))
    launch(
        _sum_kernel,
        (triton.cdiv(T, bt), triton.cdiv(H, bhs)),
        y,
        out,
        T,
        n,
        H,
        out.stride(0),
        K_TOP=k_top,
        HAS_SHARED=has_shared,
        BLOCK_T=bt,
        BLOCK_H=bhs,
        ADD_OUT=add_out,
        Y_EVICT="evict_first" if evict else "",
        num_warps=4 if big else 2,
    )
    return out
