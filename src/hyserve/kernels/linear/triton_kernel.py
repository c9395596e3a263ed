"""GEMV for the few-row case of ``y = x W^T``: x [M <= 4, K], W [N, K] (K contiguous) -> y [M, N].

At batch 1 the model's projections are matrix-vector products that must stream W once at full HBM
bandwidth. cuBLAS picks a split-K kernel plus a separate reduction for the 2048 x 4096 shapes (two
launches, about half the bandwidth); here one launch does it.

Grid (cdiv(N, BLOCK_N),): program n owns rows [n*BLOCK_N, (n+1)*BLOCK_N) of W and streams them over the
full K in [BLOCK_N, BLOCK_K] tiles (16-byte loads along K), multiplying by the M rows of x (L2-resident)
into an fp32 [BLOCK_M, BLOCK_N, BLOCK_K] accumulator that is reduced over K once at the end. No split-K,
so the result is deterministic and every W byte is read exactly once. Small tiles give many programs
per SM, which is what keeps enough loads in flight for a memory-bound kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.linear import GEMV_MAX_ROWS
from hyserve.kernels.pdl import launch_options, wait_for_previous


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = rm < M
    nm = rn < N
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    # W is no kernel's output: its first tile streams in while the previous kernel finishes (kernels/pdl.py)
    w = tl.load(w_rows + kk[None, :], mask=nm[:, None] & (kk < K)[None, :], other=0.0)
    wait_for_previous(USE_PDL)
    x = tl.load(x_rows + kk[None, :], mask=mm[:, None] & (kk < K)[None, :], other=0.0)
    acc = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + kk
        km = k < K
        w = tl.load(w_rows + k[None, :], mask=nm[:, None] & km[None, :], other=0.0)
        x = tl.load(x_rows + k[None, :], mask=mm[:, None] & km[None, :], other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    y = tl.sum(acc, axis=2)
    tl.store(
        y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :],
        y.to(y_ptr.dtype.element_ty),
        mask=mm[:, None] & nm[None, :],
    )


def gemv_triton(
    x: torch.Tensor, weight: torch.Tensor, cfg: dict, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] (M <= GEMV_MAX_ROWS, K contiguous), weight [N, K] (K contiguous) -> [M, N] in x's dtype.
    cfg: BLOCK_N, BLOCK_K (for one row; divided by M's next power of two), num_warps."""
    M, K = x.shape
    N = weight.shape[0]
    if M > GEMV_MAX_ROWS or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(
            f"gemv_triton takes at most {GEMV_MAX_ROWS} K-contiguous rows, got x {tuple(x.shape)}"
        )
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    block_m = triton.next_power_of_2(M)
    block_k = max(16, cfg["BLOCK_K"] // block_m)  # the same accumulator size for any M
    _gemv_kernel[(triton.cdiv(N, cfg["BLOCK_N"]),)](
        x,
        weight,
        out,
        M,
        N,
        K,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k,
        num_warps=cfg.get("num_warps", 4),
        **launch_options(x),
    )
    return out
