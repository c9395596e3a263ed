"""The Gated DeltaNet output norm ``w * rmsnorm(x) * silu(gate)`` per head (plain weight, no ``1 +``).

Shapes: x, gate [R1, H, D] (any leading/head strides, unit dim stride: e.g. the o of the DeltaNet kernel and
z = in_proj_z(x).view(T, HV, 128)); weight [D]; out [R1, H, D] contiguous. Rows are the R1 * H heads.
Grid: (cdiv(R1 * H, ROWS),); a program normalises ROWS heads held whole ([ROWS, BLOCK_D]): one read of x and
gate, one write. Rounding follows the reference: the normed x is cast to x's dtype, times w (rounded again
when w has x's dtype), then times silu(gate) in fp32 and cast once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gated_rms_norm_kernel(
    x_ptr,
    g_ptr,
    w_ptr,
    out_ptr,
    n_rows,
    heads,
    stride_xr,
    stride_xh,
    stride_gr,
    stride_gh,
    eps,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr,
    ROUND_WX: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    outer = rows // heads
    inner = rows % heads
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    x = tl.load(
        x_ptr + (outer * stride_xr + inner * stride_xh)[:, None] + cols[None, :], mask=mask, other=0.0
    )
    g = tl.load(
        g_ptr + (outer * stride_gr + inner * stride_gh)[:, None] + cols[None, :], mask=mask, other=0.0
    )
    dtype = out_ptr.dtype.element_ty
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 1) / D + eps)
    normed = (xf * rstd[:, None]).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = normed * w[None, :]
    if ROUND_WX:
        y = y.to(dtype).to(tl.float32)
    gf = g.to(tl.float32)
    y = y * (gf / (1.0 + tl.exp(-gf)))
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], y.to(dtype), mask=mask)


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    t = t.unsqueeze(0) if t.dim() == 1 else t
    t = t.reshape(-1, t.shape[-2], t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def gated_rms_norm_triton(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Same contract as ``gated_rms_norm_reference`` (x, gate [..., D]); returns a new contiguous tensor."""
    d = x.shape[-1]
    x3, g3 = _as_3d(x), _as_3d(gate)
    n_rows, heads = x3.shape[0] * x3.shape[1], x3.shape[1]
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if n_rows > 0:
        block_d = triton.next_power_of_2(d)
        rows = max(1, min(32, 4096 // block_d))
        _gated_rms_norm_kernel[(triton.cdiv(n_rows, rows),)](
            x3, g3, weight, out, n_rows, heads,
            x3.stride(0), x3.stride(1), g3.stride(0), g3.stride(1), eps,
            D=d, BLOCK_D=block_d, ROWS=rows, ROUND_WX=torch.result_type(weight, x) == x.dtype,
            num_warps=max(1, min(8, block_d * rows // 512)),
        )  # fmt: skip
    return out
