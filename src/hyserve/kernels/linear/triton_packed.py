"""The GEMV of ``triton_kernel.py`` over a weight in the 12-bit bf16 format (``kernels/packed_bf16``).

At batch 1 the GEMV streams its weight once and does one multiply-add a weight, so it is bound by the bytes
it reads. The 12-bit format holds the same bf16 values in 0.75 of the bytes, for ~2.6 more integer operations
an element (``packed_bf16/triton_kernel.py``): at 4.0 TB/s of 12-bit weights, ~2.7 T elements/s, that is ~7 of
the H200's ~16 T integer operations a second.

Grid, fusions (the pre-norm, the residual add, the router's raw rows), the PDL wait and the result are those
of ``_gemv_kernel``. The tile differs: [BLOCK_N rows, BLOCK_K / 8 groups of 8 elements], a group a thread, and
x (and the norm weight) load as the same [BLOCK_M, BLOCK_N, groups] grid of 16-byte groups (the same x for
every row, L1 serving the repeats), so no value moves between threads. A plan keeps one group a thread when
BLOCK_N * BLOCK_K = 8 x 32 x num_warps (each load's layout is then one element a thread); other tiles work
but Triton may shuffle through shared memory. The escapes of the program's rows (a handful of values outside their
row's exponent window, stored apart with their true value) add ``(w - v') x[col]`` to the result: the first
``ESCAPES`` entries load with the first weight tile, before the PDL wait, and their products are taken right
after it, so a program's tail is the same as the bf16 kernel's unless a row block has more (a loop at the end).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require
from hyserve.kernels.linear.triton_kernel import _gemv_store, _norm_mask, gemv_output
from hyserve.kernels.packed_bf16 import PackedBF16
from hyserve.kernels.packed_bf16.triton_kernel import (
    advance_groups,
    decode_group,
    escape_entries,
    escape_sum,
    group_ptrs,
    group_values,
)
from hyserve.kernels.pdl import launch_options, wait_for_previous


@triton.jit
def _tile_mask(nm, gg, k0, K):
    """[BLOCK_N, G]: the rows nm [BLOCK_N] and the groups gg [G] of the tile at column k0 that lie in W."""
    return nm[:, None] & ((k0 // 8 + gg) < K // 8)[None, :]


@triton.jit
def _packed_tile(
    acc, ss, w, x_ptrs, g_ptrs, xmask, gmask, HAS_NORM: tl.constexpr, REDUCE_EACH: tl.constexpr
):  # fmt: skip
    """``_gemv_tile`` of ``triton_kernel.py`` for one decoded tile w (8 x [BLOCK_N, G] fp32): acc [BLOCK_M,
    BLOCK_N, G] and ss [BLOCK_M, G] (REDUCE_EACH: [BLOCK_M, BLOCK_N] and [BLOCK_M]) += the products with x (and
    x's squares), x at x_ptrs [BLOCK_M, G] and the norm weight at g_ptrs [1, G] (``group_ptrs``). x, its squares
    and its norm weight's multiply are taken once for the BLOCK_N rows, which a thread holds in registers when
    the tile's G = 32 x num_warps groups take every thread."""
    x = group_values(x_ptrs, xmask)
    if HAS_NORM:
        nw = group_values(g_ptrs, gmask)
        sq = x[0] * x[0]
        prod = (x[0] * (1.0 + nw[0]))[:, None, :] * w[0][None, :, :]
        for e in tl.static_range(1, 8):
            sq += x[e] * x[e]
            prod += (x[e] * (1.0 + nw[e]))[:, None, :] * w[e][None, :, :]
        if REDUCE_EACH:
            ss += tl.sum(sq, axis=1)
        else:
            ss += sq
    else:
        prod = x[0][:, None, :] * w[0][None, :, :]
        for e in tl.static_range(1, 8):
            prod += x[e][:, None, :] * w[e][None, :, :]
    if REDUCE_EACH:
        acc += tl.sum(prod, axis=2)
    else:
        acc += prod
    return acc, ss


@triton.jit
def _packed_gemv_kernel(
    x_ptr,
    low_ptr,
    nib_ptr,
    base_ptr,
    eptr_ptr,
    erow_ptr,
    ecol_ptr,
    eval_ptr,
    y_ptr,
    g_ptr,
    r_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ym,
    stride_rm,
    eps,
    raw_from,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ESCAPES: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HAS_RES: tl.constexpr,
    REDUCE_EACH: tl.constexpr,
    HAS_RAW: tl.constexpr,
    ASM: tl.constexpr,
    UNROLL: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """``_gemv_kernel`` without TMA, W in the 12-bit format (``low``, ``nib``, ``base`` and the escapes of
    ``PackedBF16``; K and BLOCK_K multiples of 8). EVEN_K: K % BLOCK_K == 0 (no column masks on x). ASM: the
    decode's byte permutes as PTX (not on the interpreter)."""
    BG: tl.constexpr = BLOCK_K // 8
    pid = tl.program_id(0)
    row0 = pid * BLOCK_N
    rm = tl.arange(0, BLOCK_M)
    rn = row0 + tl.arange(0, BLOCK_N)
    mm = rm < M
    nm = rn < N
    gg = tl.arange(0, BG)
    rows = rn.to(tl.int64)
    nib_ptrs = nib_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None] * (K // 8) + gg[None, :]
    low_ptrs = low_ptr.to(tl.pointer_type(tl.uint64)) + rows[:, None] * (K // 8) + gg[None, :]
    x_ptrs = group_ptrs(x_ptr, rm.to(tl.int64)[:, None] * (stride_xm // 2) + 4 * gg[None, :].to(tl.int64))
    g_ptrs = group_ptrs(g_ptr, 4 * gg[None, :].to(tl.int64))
    every = (gg >= 0)[None, :]
    xmask = mm[:, None] & every
    gmask = _norm_mask(gg[None, :], every, row0, raw_from, HAS_RAW)
    # no kernel writes the weight: its first two tiles, the rows' windows and escapes load before the PDL
    # wait; from then on each step requests the tile two ahead of the one it multiplies
    base4 = tl.load(base_ptr + rn, mask=nm, other=0).to(tl.uint32)[:, None] * 0x01010101
    nib = tl.load(nib_ptrs, mask=_tile_mask(nm, gg, 0, K), other=0)
    low = tl.load(low_ptrs, mask=_tile_mask(nm, gg, 0, K), other=0)
    nib_next = tl.load(nib_ptrs + BG, mask=_tile_mask(nm, gg, BLOCK_K, K), other=0)
    low_next = tl.load(low_ptrs + BG, mask=_tile_mask(nm, gg, BLOCK_K, K), other=0)
    p_start = tl.load(eptr_ptr + row0)
    p_end = tl.load(eptr_ptr + tl.minimum(row0 + BLOCK_N, N))
    erow, ecol, delta = escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p_start, p_end, ESCAPES)
    wait_for_previous(USE_PDL)
    omask = mm[:, None] & nm[None, :]
    r = 0.0
    if HAS_RES:
        r = tl.load(r_ptr + rm.to(tl.int64)[:, None] * stride_rm + rn[None, :], mask=omask).to(tl.float32)
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    esc = escape_sum(erow, ecol, delta, x_rows, g_ptr, rn, mm, row0, raw_from, HAS_NORM, HAS_RAW)
    if REDUCE_EACH:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BG), dtype=tl.float32)
        ss = tl.zeros((BLOCK_M, BG), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, loop_unroll_factor=UNROLL):
        ahead = _tile_mask(nm, gg, k0 + 2 * BLOCK_K, K)
        nib_ahead = tl.load(nib_ptrs + 2 * BG, mask=ahead, other=0)
        low_ahead = tl.load(low_ptrs + 2 * BG, mask=ahead, other=0)
        if not EVEN_K:
            gm = (k0 // 8 + gg < K // 8)[None, :]
            xmask = mm[:, None] & gm
            gmask = _norm_mask(gg[None, :], gm, row0, raw_from, HAS_RAW)
        w = decode_group(nib, low.to(tl.uint32), (low >> 32).to(tl.uint32), base4, ASM)
        acc, ss = _packed_tile(acc, ss, w, x_ptrs, g_ptrs, xmask, gmask, HAS_NORM, REDUCE_EACH)
        nib, low, nib_next, low_next = nib_next, low_next, nib_ahead, low_ahead
        nib_ptrs += BG
        low_ptrs += BG
        x_ptrs = advance_groups(x_ptrs, BLOCK_K)
        g_ptrs = advance_groups(g_ptrs, BLOCK_K)
    # a row block with more escapes than one load of them (rare: ~1e-4 of the elements escape)
    for p0 in range(p_start + ESCAPES, p_end, ESCAPES):
        erow, ecol, delta = escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p0, p_end, ESCAPES)
        esc += escape_sum(erow, ecol, delta, x_rows, g_ptr, rn, mm, row0, raw_from, HAS_NORM, HAS_RAW)
    if not REDUCE_EACH:
        acc = tl.sum(acc, axis=2)
        ss = tl.sum(ss, axis=1)
    _gemv_store(acc + esc, ss, r, y_ptr, rm, rn, omask, stride_ym, K, eps, row0, raw_from, HAS_NORM, HAS_RAW)


def gemv_packed_triton(
    x: torch.Tensor,
    weight: PackedBF16,
    cfg: dict,
    out: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
    raw_from: int | None = None,
) -> torch.Tensor:
    """``gemv_triton`` (same arguments, same result up to the fp32 order of the sum) with W [N, K] a
    ``PackedBF16``. cfg: BLOCK_N, BLOCK_K (a multiple of 8), num_warps, REDUCE_EACH, maxnreg as there (no BCAST_X: x always
    loads in the product's layout; no
    TMA), ESCAPES (optional, a power of two, default 16: the escape entries a program loads at once), UNROLL
    (optional: the K loop unrolled that many times; 2 takes the loop from 69 to 56 instructions an 8-element
    group in the sm_90 build, for more registers)."""
    n, k = weight.shape
    require(x.shape[1] == k, "gemv_packed_triton: x's row length must be the packed weight's K")
    require(
        k % 8 == 0 and cfg["BLOCK_K"] % 8 == 0, "gemv_packed_triton: K and BLOCK_K must be multiples of 8"
    )
    require(not cfg.get("TMA"), "gemv_packed_triton: TMA plans are for bf16 weights")
    require(
        x.dtype != torch.bfloat16 or (x.data_ptr() % 8 == 0 and (x.stride(0) % 4 == 0 or x.shape[0] == 1)),
        "gemv_packed_triton: bf16 x must start 8-byte aligned with a row stride that is a multiple of 4 (it "
        "loads in 8-byte words)",
    )
    out = gemv_output(x, n, cfg, out, norm_weight, residual, raw_from)
    m = x.shape[0]
    if m == 0:
        return out
    block_m = triton.next_power_of_2(m)
    block_k = max(16, cfg["BLOCK_K"] // block_m)  # the same accumulator size for any M
    _packed_gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x,
        *weight.operands,
        out,
        norm_weight if norm_weight is not None else x,
        residual if residual is not None else out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        residual.stride(0) if residual is not None else 0,
        norm_eps,
        n if raw_from is None else raw_from,
        BLOCK_M=block_m,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k,
        ESCAPES=int(cfg.get("ESCAPES", 16)),
        EVEN_K=k % block_k == 0,
        HAS_NORM=norm_weight is not None,
        HAS_RES=residual is not None,
        REDUCE_EACH=bool(cfg.get("REDUCE_EACH", False)),
        HAS_RAW=raw_from is not None,
        ASM=x.is_cuda,
        UNROLL=int(cfg.get("UNROLL", 1)),
        num_warps=cfg.get("num_warps", 4),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
        **launch_options(x),
    )
    return out
