"""The Gated DeltaNet prefill gates in one launch (torch takes eight: two upcasts, add, softplus, exp, neg,
mul, sigmoid; ~16 us a layer at any prompt length on the H200, launch-bound).

Shapes: a, b [T, HV] with any token stride and unit head stride (the views of in_proj's output);
A_log, dt_bias [HV]; out g [T, HV] fp32, beta [T, HV] in b's dtype. Grid: (cdiv(T, BLOCK_T),); a program
takes BLOCK_T tokens x all heads. fp32 math; ``softplus`` as torch's (threshold 20, log1p).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def softplus(x):
    """torch's softplus (threshold 20) of fp32 x: max(x, 0) + log1p(exp(-|x|)), with log1p(e) as
    log(u) * e / (u - 1) for u = 1 + e rounded: exact to fp32 rounding where log(1 + e) alone loses e's low bits
    (2e-4 relative near x = -10). Shared with the DeltaNet decode step."""
    e = tl.exp(-tl.abs(x))
    u = 1.0 + e
    log1p = tl.where(u == 1.0, e, tl.log(u) * e / tl.where(u == 1.0, 1.0, u - 1.0))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)


@triton.jit
def gates_rows(a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, rows, rmask, stride_a, stride_b,
               HV: tl.constexpr, HP: tl.constexpr):  # fmt: skip
    """g and beta of tokens ``rows`` [BT] int64 (``rmask`` [BT]) x all HV heads: the whole gate computation of a
    program, shared by ``_gdn_gating_kernel`` and the conv kernel that computes the gates beside its conv
    (``causal_conv1d_prefill_gated``), so both give the same bits."""
    heads = tl.arange(0, HP)
    hmask = heads < HV
    mask = rmask[:, None] & hmask[None, :]
    a_log = tl.load(a_log_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + rows[:, None] * stride_a + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows[:, None] * stride_b + heads[None, :], mask=mask, other=0.0).to(tl.float32)
    g = -tl.exp(a_log)[None, :] * softplus(a + dt_bias[None, :])
    beta = tl.sigmoid(b)
    out = rows[:, None] * HV + heads[None, :]
    tl.store(g_ptr + out, g, mask=mask)
    tl.store(beta_ptr + out, beta.to(beta_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gdn_gating_kernel(
    a_ptr,
    b_ptr,
    a_log_ptr,
    dt_bias_ptr,
    g_ptr,
    beta_ptr,
    T,
    stride_a,
    stride_b,
    HV: tl.constexpr,
    HP: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    gates_rows(
        a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, rows, rows < T, stride_a, stride_b, HV, HP
    )


def gdn_gating_triton(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``gdn_gating_reference``."""
    tokens, heads = a.shape
    g = torch.empty((tokens, heads), dtype=torch.float32, device=a.device)
    beta = torch.empty((tokens, heads), dtype=b.dtype, device=a.device)
    if tokens > 0:
        hp = triton.next_power_of_2(heads)
        block_t = max(1, min(64, 4096 // hp))
        _gdn_gating_kernel[(triton.cdiv(tokens, block_t),)](
            a, b, A_log, dt_bias, g, beta, tokens, a.stride(0), b.stride(0),
            HV=heads, HP=hp, BLOCK_T=block_t, num_warps=4,
        )  # fmt: skip
    return g, beta
