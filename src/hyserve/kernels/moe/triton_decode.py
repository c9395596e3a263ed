"""Decode down projection + the weighted sum over experts, in one deterministic kernel.

Shapes: h [N + T, I] (``triton_gate_up``: rows already scaled by the routing weight / the shared
expert's sigmoid gate), w_down [E, H, I] (I contiguous), shared_down [H, I] as "expert E",
out [T, H] in x's dtype, T <= TP (a power of two, <= 128).

    out[t] = sum over the rows r of token t (its k pairs and its shared-expert row) of h[r] @ W_down[e_r].T

Grid (cdiv(H, BLOCK_H),): program p owns the output columns [p*BLOCK_H, (p+1)*BLOCK_H) of *all* T tokens
and walks the whole block list (every expert touched this step, then the shared expert): per block it
loads the [BLOCK_H, I] slice of that expert's down weights once, forms y = h_rows @ W.T
([BLOCK_M, BLOCK_H], fp32) and adds it into its [TP, BLOCK_H] fp32 accumulator through a one-hot
[TP, BLOCK_M] matrix (a tiny dot: the "scatter" of the block's rows to their tokens). The expert order
is fixed, so the result is bitwise reproducible, with no atomics, no [T, k, H] intermediate and no
second reduction kernel. Each weight byte is read once per step; the loop over blocks is one flat
loop (software-pipelined by num_stages) so the weight stream of consecutive experts overlaps.

For bf16 the block output y is rounded to bf16 before the one-hot dot (exact products, fp32 sums),
which is where the reference rounds too (its expert output is a bf16 linear); fp32 uses an ieee dot.
USE_DOT False (BLOCK_M < 16): GEMV-style broadcast-reduce instead of tensor-core dots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require
from hyserve.kernels.moe.routing import block_rows
from hyserve.kernels.moe.triton_gate_up import dot_precision
from hyserve.kernels.moe.workspace import empty, launch
from hyserve.kernels.pdl import wait_for_previous


@triton.jit(do_not_specialize=["T", "N", "MAXB"])
def _down_reduce_kernel(
    h_ptr,
    w_ptr,
    sw_ptr,
    sorted_ptr,
    meta_ptr,
    out_ptr,
    T,
    N,
    H,
    I,
    E,
    MAXB,
    stride_we,
    stride_wh,
    stride_sh,
    stride_ot,
    K_TOP: tl.constexpr,
    TP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_K: tl.constexpr,
    EVEN: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_PREC: tl.constexpr,
    ADD_OUT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_previous(USE_PDL)
    p = tl.program_id(0)
    hh = p * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hh < H
    tp = tl.arange(0, TP)
    kk = tl.arange(0, BLOCK_K)
    nblocks = tl.load(meta_ptr + 3 * MAXB)
    acc = tl.zeros((TP, BLOCK_H), dtype=tl.float32)
    for b in range(0, nblocks):
        e, is_shared, pos, rmask, routed, pair = block_rows(meta_ptr, sorted_ptr, b, N, E, MAXB, BLOCK_M)
        tok = tl.where(pos >= N, pos - N, pair // K_TOP)
        tok = tl.where(rmask, tok, -1)
        wbase = tl.where(is_shared, sw_ptr, w_ptr + e.to(tl.int64) * stride_we)
        stride_h = tl.where(is_shared, stride_sh, stride_wh)
        w_rows = wbase + hh.to(tl.int64) * stride_h
        h_rows = h_ptr + pos.to(tl.int64) * I
        onehot = tp[:, None] == tok[None, :]
        if USE_DOT:
            y = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
            for kc in tl.static_range(NUM_K):
                k = kc * BLOCK_K + kk
                ht = tl.load(h_rows[:, None] + k[None, :], mask=rmask[:, None] & (k[None, :] < I), other=0.0)
                if EVEN:
                    wt = tl.load(w_rows[None, :] + k[:, None])
                else:
                    wt = tl.load(
                        w_rows[None, :] + k[:, None], mask=(k[:, None] < I) & hmask[None, :], other=0.0
                    )
                y = tl.dot(ht, wt, y, input_precision=DOT_PREC)
            yt = y.to(h_ptr.dtype.element_ty)
            acc = tl.dot(onehot.to(yt.dtype), yt, acc, input_precision=DOT_PREC)
        else:
            y = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
            for kc in tl.static_range(NUM_K):
                k = kc * BLOCK_K + kk
                ht = tl.load(h_rows[:, None] + k[None, :], mask=rmask[:, None] & (k[None, :] < I), other=0.0)
                if EVEN:
                    wt = tl.load(w_rows[:, None] + k[None, :])
                else:
                    wt = tl.load(
                        w_rows[:, None] + k[None, :], mask=hmask[:, None] & (k[None, :] < I), other=0.0
                    )
                y += tl.sum(ht.to(tl.float32)[:, None, :] * wt.to(tl.float32)[None, :, :], axis=2)
            yt = y.to(h_ptr.dtype.element_ty).to(tl.float32)
            acc += tl.sum(tl.where(onehot[:, :, None], yt[None, :, :], 0.0), axis=1)
    o_ptrs = out_ptr + tp[:, None].to(tl.int64) * stride_ot + hh[None, :]
    omask = (tp < T)[:, None] & hmask[None, :]
    if ADD_OUT:  # out is the residual stream: out += the MoE output, in fp32 before the one cast
        acc += tl.load(o_ptrs, mask=omask, other=0.0).to(tl.float32)
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=omask)


MAX_REDUCE_TOKENS = 128


def down_reduce(
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
    """h [N + T, I] -> out [T, H] (see the module docstring); with ``add_out`` the result is added to out's
    contents (the residual stream). cfg: BLOCK_H, BLOCK_K, num_warps, num_stages."""
    E, H, inter = w_down.shape
    require(T <= MAX_REDUCE_TOKENS, "the reduce down takes at most MAX_REDUCE_TOKENS tokens")
    require(w_down.stride(2) == 1, "the reduce down needs w_down with a contiguous last dim")
    if out is None:
        out = empty((T, H), h.dtype, h.device)
    sw = shared_down if shared_down is not None else w_down
    if shared_down is not None:
        require(
            shared_down.shape == (H, inter) and shared_down.stride(1) == 1,
            "the reduce down needs shared_down [H, I] (the routed experts' I) with a contiguous last dim",
        )
    bh, bk = cfg["BLOCK_H"], cfg["BLOCK_K"]
    use_dot = block_m >= 16
    tp = triton.next_power_of_2(T)
    if use_dot:
        tp = max(tp, 16)
    launch(
        _down_reduce_kernel,
        (triton.cdiv(H, bh),),
        h,
        w_down,
        sw,
        sorted_pairs,
        meta,
        out,
        T,
        T * k_top,
        H,
        inter,
        E,
        max_blocks,
        w_down.stride(0),
        w_down.stride(1),
        sw.stride(0),
        out.stride(0),
        K_TOP=k_top,
        TP=tp,
        BLOCK_M=block_m,
        BLOCK_H=bh,
        BLOCK_K=bk,
        NUM_K=triton.cdiv(inter, bk),
        EVEN=(inter % bk == 0) and (H % bh == 0),
        USE_DOT=use_dot,
        DOT_PREC=dot_precision(h.dtype),
        ADD_OUT=add_out,
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 3),
    )
    return out
