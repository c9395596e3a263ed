"""Zero-centred RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)``, optionally fused with the residual add.

Shapes: x (and residual) [R, D] rows of unit column stride (leading dims flattened by the wrapper), weight
[D]; out [R, D] and, with a residual, h = x + residual [R, D] (both new, contiguous).
Grid: (cdiv(R, ROWS),); a program holds ROWS whole rows ([ROWS, BLOCK_D], BLOCK_D = next_pow2(D)), so the
reduction needs no second pass over memory: one read of x (+ residual), one write of out (+ h). For the
model's hidden size 2048 that is one row per program (8 warps, 8 elements a thread); small D packs rows.
The residual sum is rounded to x's dtype before the norm, as ``x + residual`` is in the reference; the norm
itself is fp32 and cast once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.pdl import launch_options, wait_for_previous


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    h_ptr,
    n_rows,
    stride_x,
    stride_r,
    eps,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_RES: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_previous(USE_PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + rows[:, None] * D + cols[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 1) / D + eps)
    w = 1.0 + tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = xf * rstd[:, None] * w[None, :]
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_shape(d: int) -> tuple[int, int, int]:
    """(BLOCK_D, ROWS, num_warps) for rows of length d: about 2-4K elements per program, 8-16 per thread."""
    block_d = triton.next_power_of_2(d)
    rows = max(1, min(64, 2048 // block_d))
    num_warps = max(1, min(16, block_d * rows // 256))
    return block_d, rows, num_warps


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``rms_norm_reference``; ``out`` (optional, contiguous like x) receives the norm."""
    d = x.shape[-1]
    x2 = _rows(x)
    n_rows = x2.shape[0]
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    r2 = _rows(residual) if residual is not None else x2
    if n_rows > 0:
        block_d, rows, num_warps = launch_shape(d)
        _rms_norm_kernel[(triton.cdiv(n_rows, rows),)](
            x2, r2, weight, out, h, n_rows, x2.stride(0), r2.stride(0), eps,
            D=d, BLOCK_D=block_d, ROWS=rows, HAS_RES=residual is not None, num_warps=num_warps,
            **launch_options(x),
        )  # fmt: skip
    return out if residual is None else (out, h)
