"""The gated attention's output gate as one pass: ``out = o * sigmoid(gate)`` in fp32, rounded once.

o [T, H, D] and gate [T, H, D] may be strided views (unit last stride; the gate is q_proj's output, interleaved
with the queries), out [T, H, D] contiguous. Grid (T, cdiv(H * D, BLOCK)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gate_kernel(
    o_ptr, g_ptr, out_ptr, HD, D, stride_ot, stride_oh, stride_gt, stride_gh, BLOCK: tl.constexpr
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < HD
    h = c // D
    d = c % D
    o = tl.load(o_ptr + t * stride_ot + h * stride_oh + d, mask=m, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + t * stride_gt + h * stride_gh + d, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * HD + c, (o / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty), mask=m)


def sigmoid_gate_triton(o: torch.Tensor, gate: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """o, gate [T, H, D] (unit last stride) -> a new contiguous [T, H, D] in o's dtype."""
    t, h, d = o.shape
    out = torch.empty((t, h, d), dtype=o.dtype, device=o.device)
    if t:
        _gate_kernel[(t, triton.cdiv(h * d, block))](
            o, gate, out, h * d, d, o.stride(0), o.stride(1), gate.stride(0), gate.stride(1), BLOCK=block
        )
    return out
