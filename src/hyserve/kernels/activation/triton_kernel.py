"""SwiGLU ``silu(gate) * up`` over a fused [gate (I) | up (I)] projection.

Shapes: x [R, 2I] (leading dims flattened by the wrapper; any row stride, unit column stride); out [R, I].
Grid: (R, cdiv(I, BLOCK)); a program reads BLOCK gate and BLOCK up values of one row and writes BLOCK
outputs: purely bandwidth-bound, fp32 math, one cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, I: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * I + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as ``silu_and_mul_reference``: [..., 2I] -> [..., I]."""
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if out is None:
        out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if x2.shape[0] > 0 and inter > 0:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            x2, out, x2.stride(0), I=inter, BLOCK=block, num_warps=max(1, min(4, block // 256))
        )
    return out
