"""GEMV for the few-row case of ``y = x W^T``: x [M <= 4, K], W [N, K] (K contiguous) -> y [M, N].

At batch 1 the model's projections are matrix-vector products that must stream W once at full HBM
bandwidth. cuBLAS picks a split-K kernel plus a separate reduction for the 2048 x 4096 shapes (two
launches, about half the bandwidth); here one launch does it.

Grid (cdiv(N, BLOCK_N),): program n owns rows [n*BLOCK_N, (n+1)*BLOCK_N) of W and streams them over the
full K in [BLOCK_N, BLOCK_K] tiles (16-byte loads along K), multiplying by the M rows of x (L2-resident)
into an fp32 [BLOCK_M, BLOCK_N, BLOCK_K] accumulator that is reduced over K once at the end. No split-K,
so the result is deterministic and every W byte is read exactly once. Small tiles give many programs
per SM, which is what keeps enough loads in flight for a memory-bound kernel.

Fused around it (the decode step's norms and residual adds, which would otherwise be ~80 launches of their
own): with ``norm_weight`` x is first RMS-normalised (zero-centred, ``(1 + w)``), and with ``residual`` the
result is added to it in place. The norm needs the whole row's mean square, which every program sees anyway
(it streams all of K): ``y = rstd * sum_k x_k (1 + w_k) W_nk`` with ``rstd`` from the same loads, so the
normalised x is never rounded to x's dtype (the unfused path rounds it once: a difference of that rounding,
not of the math). The residual add happens in fp32 before the one cast; each program reads and writes only
its own columns, so the residual may be the output.

With the plan's ``TMA`` (a stage count, 0 = off) W streams through a Hopper tensor descriptor: each
[BLOCK_N, BLOCK_K] tile is one TMA copy into shared memory, and the K loop is software-pipelined TMA-1 tiles
deep (Triton's pipeliner issues the next tiles' copies before this tile's multiply), so a program keeps
several tiles in flight without holding them in registers. The first tile is copied before the PDL wait.
TMA needs sm_90+, BLOCK_K <= 256 and 16-byte aligned rows; elsewhere the option is ignored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels import tma
from hyserve.kernels.linear import GEMV_MAX_ROWS
from hyserve.kernels.pdl import launch_options, wait_for_previous


@triton.jit
def _gemv_tile(
    acc, ss, w, g, x_rows, k, km, mm, HAS_NORM: tl.constexpr, REDUCE_EACH: tl.constexpr, BCAST_X: tl.constexpr
):
    """acc [BLOCK_M, BLOCK_N, BLOCK_K] += x[:, k] (times 1 + g, the norm weight's tile, with the norm) * the
    W tile w; ss [BLOCK_M, BLOCK_K] += x[:, k]^2 (REDUCE_EACH: both summed over k, acc [BLOCK_M, BLOCK_N] and
    ss [BLOCK_M]). BCAST_X: x is loaded straight into the product's [BLOCK_M, BLOCK_N, BLOCK_K] layout (the
    same row for every n, L1 serving the repeats) instead of as [BLOCK_M, BLOCK_K] then broadcast, which
    Triton does through shared memory every K step: 19 -> 7 CTA barriers for in_proj with its norm (sm_90
    build), but 140 registers a thread instead of 120 (three programs an SM instead of four)."""
    if BCAST_X:
        zero = tl.zeros((1, w.shape[0], 1), dtype=tl.int32)
        xm = mm[:, None, None] & km[None, None, :]
        x = tl.load(x_rows[:, :, None] + zero + k[None, None, :], mask=xm, other=0.0).to(tl.float32)
        if HAS_NORM:  # the copies along n are equal: their max is x^2 itself
            if REDUCE_EACH:
                ss += tl.sum(tl.max(x * x, axis=1), axis=1)
            else:
                ss += tl.max(x * x, axis=1)
            x = x * (1.0 + g.to(tl.float32))[None, None, :]
    else:
        x = tl.load(x_rows + k[None, :], mask=mm[:, None] & km[None, :], other=0.0).to(tl.float32)
        if HAS_NORM:
            if REDUCE_EACH:
                ss += tl.sum(x * x, axis=1)
            else:
                ss += x * x
            x = x * (1.0 + g.to(tl.float32))[None, :]
        x = x[:, None, :]
    if REDUCE_EACH:
        acc += tl.sum(x * w.to(tl.float32)[None, :, :], axis=2)
    else:
        acc += x * w.to(tl.float32)[None, :, :]
    return acc, ss


@triton.jit
def _norm_mask(k, km, row0, raw_from, HAS_RAW: tl.constexpr):
    """The norm weight's load mask at columns k: a raw program (HAS_RAW, its first row ``row0`` >= raw_from)
    loads none of it, so its x is multiplied by 1 + 0. (The row test is taken elementwise: the interpreter
    mis-types a scalar bool & a mask.)"""
    if HAS_RAW:
        km = km & (k * 0 + row0 < raw_from)
    return km


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    w_desc,
    y_ptr,
    g_ptr,
    r_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    stride_rm,
    eps,
    raw_from,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HAS_RES: tl.constexpr,
    REDUCE_EACH: tl.constexpr,
    TMA: tl.constexpr,
    BCAST_X: tl.constexpr,
    HAS_RAW: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """w_desc: W's tensor descriptor with [BLOCK_N, BLOCK_K] boxes when TMA > 0 (else unused). HAS_RAW (with
    HAS_NORM): the programs of rows >= ``raw_from`` (a multiple of BLOCK_N) take x as it is, without the norm."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = rm < M
    nm = rn < N
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    # W and the norm weight are no kernel's output: their first tiles stream in while the previous kernel
    # finishes (kernels/pdl.py); the residual, an output, loads right after the wait, off the tail
    if TMA:
        w = w_desc.load([pid * BLOCK_N, 0])
    else:
        w = tl.load(w_rows + kk[None, :], mask=nm[:, None] & (kk < K)[None, :], other=0.0)
    g = tl.zeros((BLOCK_K,), dtype=tl.float32)
    # raw rows: the norm weight's tiles masked off ((1 + 0) x) and rstd not applied
    if HAS_NORM:
        g = tl.load(g_ptr + kk, mask=_norm_mask(kk, kk < K, pid * BLOCK_N, raw_from, HAS_RAW), other=0.0)
    wait_for_previous(USE_PDL)
    omask = mm[:, None] & nm[None, :]
    r = 0.0
    if HAS_RES:
        r = tl.load(r_ptr + rm.to(tl.int64)[:, None] * stride_rm + rn[None, :], mask=omask).to(tl.float32)
    if REDUCE_EACH:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        ss = tl.zeros((BLOCK_M,), dtype=tl.float32)  # the rows' sums of squares (HAS_NORM)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        ss = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    acc, ss = _gemv_tile(acc, ss, w, g, x_rows, kk, kk < K, mm, HAS_NORM, REDUCE_EACH, BCAST_X)
    if TMA:  # pipelined: the copies of the next TMA-1 tiles are in flight during this one's multiply
        for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=TMA):
            k = k0 + kk
            km = k < K
            w = w_desc.load([pid * BLOCK_N, k0])
            if HAS_NORM:
                g = tl.load(g_ptr + k, mask=_norm_mask(k, km, pid * BLOCK_N, raw_from, HAS_RAW), other=0.0)
            acc, ss = _gemv_tile(acc, ss, w, g, x_rows, k, km, mm, HAS_NORM, REDUCE_EACH, BCAST_X)
    else:
        for k0 in range(BLOCK_K, K, BLOCK_K):
            k = k0 + kk
            km = k < K
            w = tl.load(w_rows + k[None, :], mask=nm[:, None] & km[None, :], other=0.0)
            if HAS_NORM:
                g = tl.load(g_ptr + k, mask=_norm_mask(k, km, pid * BLOCK_N, raw_from, HAS_RAW), other=0.0)
            acc, ss = _gemv_tile(acc, ss, w, g, x_rows, k, km, mm, HAS_NORM, REDUCE_EACH, BCAST_X)
    if not REDUCE_EACH:
        acc = tl.sum(acc, axis=2)
        ss = tl.sum(ss, axis=1)
    _gemv_store(
        acc, ss, r, y_ptr, rm, rn, omask, stride_ym, K, eps, pid * BLOCK_N, raw_from, HAS_NORM, HAS_RAW
    )


@triton.jit
def _gemv_store(y, ss, r, y_ptr, rm, rn, omask, stride_ym, K, eps, row0, raw_from, HAS_NORM: tl.constexpr,
                HAS_RAW: tl.constexpr):  # fmt: skip
    """A GEMV program's end, whatever its weight's format: y [BLOCK_M, BLOCK_N] fp32 (x W^T of its rows), ss
    [BLOCK_M] x's sums of squares -> ``[r +] y / rms`` (no rms in a raw program: first row row0 >= raw_from)
    stored in y's dtype, one cast."""
    if HAS_NORM:
        rms = tl.sqrt(ss / K + eps)
        if HAS_RAW:
            rms = tl.where(row0 < raw_from, rms, 1.0)
        y = y / rms[:, None]
    y += r
    tl.store(
        y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :], y.to(y_ptr.dtype.element_ty), mask=omask
    )


def gemv_output(
    x: torch.Tensor,
    n: int,
    cfg: dict,
    out: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    residual: torch.Tensor | None,
    raw_from: int | None,
) -> torch.Tensor:
    """Check the GEMV's arguments against x [M, K] and an output width ``n`` (the contract of ``gemv_triton``,
    whatever the weight's format) and return the output: ``out``, else the residual, else a new [M, n]."""
    M, K = x.shape
    if M > GEMV_MAX_ROWS or x.stride(1) != 1:
        raise ValueError(f"the GEMV takes at most {GEMV_MAX_ROWS} K-contiguous rows, got x {tuple(x.shape)}")
    if residual is not None and (residual.shape != (M, n) or residual.stride(1) != 1):
        raise ValueError(
            f"the residual must be [{M}, {n}] with unit column stride, got {tuple(residual.shape)}"
        )
    if norm_weight is not None and norm_weight.shape != (K,):
        raise ValueError(f"norm_weight must be [{K}], got {tuple(norm_weight.shape)}")
    if raw_from is not None and (norm_weight is None or raw_from % cfg["BLOCK_N"] or not 0 <= raw_from <= n):
        raise ValueError(
            f"raw_from {raw_from} needs a norm and a multiple of BLOCK_N {cfg['BLOCK_N']} in [0, {n}]"
        )
    if out is not None:
        return out
    return residual if residual is not None else torch.empty((M, n), dtype=x.dtype, device=x.device)


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    cfg: dict,
    out: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
    raw_from: int | None = None,
) -> torch.Tensor:
    """x [M, K] (M <= GEMV_MAX_ROWS, K contiguous), weight [N, K] (K contiguous) -> [M, N] in x's dtype:
    ``[residual +] rms_norm(x, norm_weight, norm_eps) W^T`` (the norm without ``norm_weight``). With a
    residual [M, N] (N contiguous) and no ``out``, the result is written into the residual and returned.
    cfg: BLOCK_N, BLOCK_K (for one row; divided by M's next power of two), num_warps, REDUCE_EACH (optional:
    reduce the products over K every tile, not once at the end: a [BLOCK_N] accumulator instead of
    [BLOCK_N, BLOCK_K], so more programs fit an SM), TMA (optional, a stage count: W through a TMA
    descriptor, the K loop pipelined that deep; BLOCK_K <= 256 for one row), BCAST_X (optional: x loaded in
    the product's layout, ``_gemv_tile``), maxnreg (optional, CUDA: a register cap a thread, so more programs
    fit an SM, spilling what does not fit; ``aot_check`` prints both). ``raw_from`` (with the norm; a multiple
    of BLOCK_N): output columns
    from it on are ``x W^T`` without the norm (the router's rows of ``kernels/routed_projection``)."""
    if weight.stride(1) != 1:
        raise ValueError(f"gemv_triton needs a K-contiguous weight, got strides {weight.stride()}")
    out = gemv_output(x, weight.shape[0], cfg, out, norm_weight, residual, raw_from)
    M, K = x.shape
    N = weight.shape[0]
    if M == 0:
        return out
    block_m = triton.next_power_of_2(M)
    block_k = max(16, cfg["BLOCK_K"] // block_m)  # the same accumulator size for any M
    w_desc = tma.descriptor(weight, [cfg["BLOCK_N"], block_k]) if cfg.get("TMA") else None
    stages = int(cfg["TMA"]) if w_desc is not None else 0
    _gemv_kernel[(triton.cdiv(N, cfg["BLOCK_N"]),)](
        x,
        weight,
        w_desc if w_desc is not None else weight,
        out,
        norm_weight if norm_weight is not None else x,
        residual if residual is not None else out,
        M,
        N,
        K,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        residual.stride(0) if residual is not None else 0,
        norm_eps,
        N if raw_from is None else raw_from,
        BLOCK_M=block_m,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k,
        HAS_NORM=norm_weight is not None,
        HAS_RES=residual is not None,
        REDUCE_EACH=bool(cfg.get("REDUCE_EACH", False)),
        TMA=stages,
        BCAST_X=bool(cfg.get("BCAST_X", False)),
        HAS_RAW=raw_from is not None,
        num_warps=cfg.get("num_warps", 4),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
        **launch_options(x),
    )
    return out
