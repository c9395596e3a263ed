"""Per-head zero-centred RMSNorm of q and k, then NeoX rotary on the first ``rotary_dim`` dims, one kernel.

Shapes: q [T, Hq, D], k [T, Hk, D] as strided views (q is the first D of each head of q_proj's
[T, Hq, 2D] output: token stride Hq*2D, head stride 2D; only the dim stride must be 1, nothing is copied);
q_weight/k_weight [D] (applied as 1 + w); cos/sin [P, rotary_dim // 2] fp32 tables (any row stride), read at
each token's position (positions [T], int32 or int64): built once, they cost a decode step no launches.
Outputs: new contiguous q [T, Hq, D] and k [T, Hk, D].
Grid: (T,); a program takes every q head and every k head of one token ([BLOCK_H, BLOCK_D] tiles), so the
token's cos/sin row is loaded once. The rotation partner (d +- rotary_dim/2) is re-read from memory (an L1
hit) and normalised the same way rather than shuffled in registers. The normed value is rounded to the
input dtype before the rotation, as in the reference; the rotation is fp32 and cast once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.pdl import launch_options, wait_for_previous


@triton.jit
def _norm_rope_heads(
    in_ptr,
    out_ptr,
    w,
    wp,
    partner,
    cos,
    sin,
    tok,
    stride_t,
    stride_h,
    eps,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROT: tl.constexpr,
):
    """Norm + rotary of one token's H heads; w, wp: [BLOCK_D] ``1 + weight`` at each column and at its
    rotation ``partner`` column (loaded by the caller before the PDL wait)."""
    HALF: tl.constexpr = ROT // 2
    offs_h = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    mask = (offs_h < H)[:, None] & col_ok[None, :]
    base = in_ptr + tok * stride_t + offs_h[:, None] * stride_h
    x = tl.load(base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 1) / D + eps)
    dtype = out_ptr.dtype.element_ty
    y = (x * rstd[:, None] * w[None, :]).to(dtype).to(tl.float32)
    in_rot = cols < ROT
    first = cols < HALF  # the first half's partner is subtracted, the second half's added
    xp = tl.load(base + partner[None, :], mask=mask & in_rot[None, :], other=0.0).to(tl.float32)
    yp = (xp * rstd[:, None] * wp[None, :]).to(dtype).to(tl.float32)
    y = tl.where(
        in_rot[None, :], y * cos[None, :] + tl.where(first, -1.0, 1.0)[None, :] * yp * sin[None, :], y
    )
    tl.store(out_ptr + tok * (H * D) + offs_h[:, None] * D + cols[None, :], y.to(dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ct,
    stride_st,
    eps,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    D: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    in_rot = cols < ROT
    freq = cols % (ROT // 2)
    # the position (a step input, written before the forward), its cos/sin table rows and the norm weights
    # (and their values at the rotation partners) load while the previous kernel finishes (kernels/pdl.py)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cos = tl.load(cos_ptr + pos * stride_ct + freq, mask=in_rot, other=1.0)
    sin = tl.load(sin_ptr + pos * stride_st + freq, mask=in_rot, other=0.0)
    # rotation partner of column d < ROT: d + ROT/2 (first half) or d - ROT/2 (second half)
    partner = tl.where(in_rot, tl.where(cols < ROT // 2, cols + ROT // 2, cols - ROT // 2), cols)
    col_ok = cols < D
    qw = 1.0 + tl.load(qw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    kw = 1.0 + tl.load(kw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    qwp = 1.0 + tl.load(qw_ptr + partner, mask=in_rot, other=0.0).to(tl.float32)
    kwp = 1.0 + tl.load(kw_ptr + partner, mask=in_rot, other=0.0).to(tl.float32)
    wait_for_previous(USE_PDL)
    _norm_rope_heads(
        q_ptr,
        q_out_ptr,
        qw,
        qwp,
        partner,
        cos,
        sin,
        tok,
        stride_qt,
        stride_qh,
        eps,
        HQ,
        D,
        BLOCK_HQ,
        BLOCK_D,
        ROT,
    )
    _norm_rope_heads(
        k_ptr,
        k_out_ptr,
        kw,
        kwp,
        partner,
        cos,
        sin,
        tok,
        stride_kt,
        stride_kh,
        eps,
        HK,
        D,
        BLOCK_HK,
        BLOCK_D,
        ROT,
    )


def qk_norm_rope_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    rotary_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``qk_norm_rope_reference``; q, k may be strided views (unit dim stride)."""
    num_tokens, hq, d = q.shape
    hk = k.shape[1]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    q_out = torch.empty((num_tokens, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((num_tokens, hk, d), dtype=k.dtype, device=k.device)
    if num_tokens > 0:
        block_d = triton.next_power_of_2(d)
        _qk_norm_rope_kernel[(num_tokens,)](
            q, k, q_weight, k_weight, cos, sin, positions.contiguous(), q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0), eps,
            HQ=hq, HK=hk, D=d, BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HK=triton.next_power_of_2(hk),
            BLOCK_D=block_d, ROT=rotary_dim,
            num_warps=max(1, min(8, triton.next_power_of_2(hq) * block_d // 512)), **launch_options(q),
        )  # fmt: skip
    return q_out, k_out
