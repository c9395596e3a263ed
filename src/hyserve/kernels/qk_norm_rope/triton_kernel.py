"""Per-head zero-centred RMSNorm of q and k, then NeoX rotary on the first ``rotary_dim`` dims, one kernel;
optionally with the KV-cache store fused in (``qk_norm_rope_store_triton``).

Shapes: q [T, Hq, D], k [T, Hk, D] as strided views (q is the first D of each head of q_proj's
[T, Hq, 2D] output: token stride Hq*2D, head stride 2D; only the dim stride must be 1, nothing is copied);
q_weight/k_weight [D] (applied as 1 + w); cos/sin [P, rotary_dim // 2] fp32 tables (any row stride), read at
each token's position (positions [T], int32 or int64): built once, they cost a decode step no launches.
Outputs: new contiguous q [T, Hq, D] and k [T, Hk, D]; or, fused, new q and the normed/roped k and the raw
v [T, Hk, D] written into k_cache/v_cache [num_blocks, PAGE, Hk, D] at slot_mapping [T] (flat slot
``block * PAGE + offset``; negative: nothing written), so the paged attention reads the new keys from the
cache without a store kernel between.
Grid: (T,); a program takes every q head and every k head (and, fused, every v head) of one token
([BLOCK_H, BLOCK_D] tiles), so the token's cos/sin row is loaded once. The rotation partner
(d +- rotary_dim/2) is re-read from memory (an L1 hit) and normalised the same way rather than shuffled in
registers. The normed value is rounded to the output dtype before the rotation, as in the reference; the
rotation is fp32 and cast once. Both kernels run the same per-token helpers (``token_tables``,
``norm_rope_tile``); the fused one points k's output at the cache slot row and adds v, as a kernel of its
own so that each launch passes only the operands it uses (no placeholder pointers).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import unit_dim_stride
from hyserve.kernels.pdl import launch_options, wait_for_previous


@triton.jit
def token_tables(
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    pos,
    stride_ct,
    stride_st,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROT: tl.constexpr,
):
    """What one token's heads need besides their values, all [BLOCK_D]: the cos/sin table rows at ``pos``,
    each column's rotation partner, and ``1 + weight`` of q and k at each column and at its partner. No
    kernel writes any of it, so the kernels load it before the PDL wait (kernels/pdl.py)."""
    cols = tl.arange(0, BLOCK_D)
    in_rot = cols < ROT
    freq = cols % (ROT // 2)
    cos = tl.load(cos_ptr + pos * stride_ct + freq, mask=in_rot, other=1.0)
    sin = tl.load(sin_ptr + pos * stride_st + freq, mask=in_rot, other=0.0)
    # rotation partner of column d < ROT: d + ROT/2 (first half) or d - ROT/2 (second half)
    partner = tl.where(in_rot, tl.where(cols < ROT // 2, cols + ROT // 2, cols - ROT // 2), cols)
    col_ok = cols < D
    qw = 1.0 + tl.load(qw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    kw = 1.0 + tl.load(kw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    qwp = 1.0 + tl.load(qw_ptr + partner, mask=in_rot, other=0.0).to(tl.float32)
    kwp = 1.0 + tl.load(kw_ptr + partner, mask=in_rot, other=0.0).to(tl.float32)
    return cos, sin, partner, qw, qwp, kw, kwp


@triton.jit
def norm_rope_tile(
    x_row,
    stride_xh,
    num_h,
    w,
    wp,
    partner,
    cos,
    sin,
    eps,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROT: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """Norm + rotary of one token's first ``num_h`` heads (fewer than the tile: masked loads, zero rows), read
    from ``x_row`` (pointing at the token's head 0; head stride ``stride_xh``, unit dim stride). Returns the
    [BLOCK_H, BLOCK_D] fp32 tile (the normed values rounded to DTYPE before the rotation, as the reference;
    the caller casts it once), its mask and the tile's head and column offsets. w, wp: [BLOCK_D] ``1 + weight``
    at each column and at its rotation ``partner`` column."""
    HALF: tl.constexpr = ROT // 2
    offs_h = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    mask = (offs_h < num_h)[:, None] & col_ok[None, :]
    base = x_row + offs_h[:, None] * stride_xh
    x = tl.load(base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 1) / D + eps)
    y = (x * rstd[:, None] * w[None, :]).to(DTYPE).to(tl.float32)
    in_rot = cols < ROT
    first = cols < HALF  # the first half's partner is subtracted, the second half's added
    xp = tl.load(base + partner[None, :], mask=mask & in_rot[None, :], other=0.0).to(tl.float32)
    yp = (xp * rstd[:, None] * wp[None, :]).to(DTYPE).to(tl.float32)
    y = tl.where(
        in_rot[None, :], y * cos[None, :] + tl.where(first, -1.0, 1.0)[None, :] * yp * sin[None, :], y
    )
    return y, mask, offs_h, cols


@triton.jit
def norm_rope_heads(
    x_row,
    stride_xh,
    out_row,
    stride_oh,
    num_h,
    w,
    wp,
    partner,
    cos,
    sin,
    eps,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROT: tl.constexpr,
):
    """``norm_rope_tile`` of one token's first ``num_h`` heads written to ``out_row`` (head stride ``stride_oh``)
    in its dtype."""
    y, mask, offs_h, cols = norm_rope_tile(x_row, stride_xh, num_h, w, wp, partner, cos, sin, eps, D, BLOCK_H,
                                           BLOCK_D, ROT, out_row.dtype.element_ty)  # fmt: skip
    tl.store(out_row + offs_h[:, None] * stride_oh + cols[None, :], y.to(out_row.dtype.element_ty), mask=mask)


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
    # the position is a step input (written before the forward): it and the tables load before the wait
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cos, sin, partner, qw, qwp, kw, kwp = token_tables(
        qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos, stride_ct, stride_st, D, BLOCK_D, ROT
    )
    wait_for_previous(USE_PDL)
    q_in, q_out = q_ptr + tok * stride_qt, q_out_ptr + tok * (HQ * D)
    norm_rope_heads(q_in, stride_qh, q_out, D, HQ, qw, qwp, partner, cos, sin, eps, D, BLOCK_HQ, BLOCK_D, ROT)
    k_in, k_out = k_ptr + tok * stride_kt, k_out_ptr + tok * (HK * D)
    norm_rope_heads(k_in, stride_kh, k_out, D, HK, kw, kwp, partner, cos, sin, eps, D, BLOCK_HK, BLOCK_D, ROT)


@triton.jit
def _qk_norm_rope_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slot_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ct,
    stride_st,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    eps,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    D: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROT: tl.constexpr,
    PAGE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    # the position and the slot are step inputs (written before the forward): they and the tables load
    # before the wait
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    cos, sin, partner, qw, qwp, kw, kwp = token_tables(
        qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos, stride_ct, stride_st, D, BLOCK_D, ROT
    )
    num_kv = tl.where(slot >= 0, HK, 0)  # a negative slot (a padding token) masks every k and v head
    safe = tl.maximum(slot, 0)
    k_row = k_cache_ptr + (safe // PAGE) * stride_kcb + (safe % PAGE) * stride_kcs
    v_row = v_cache_ptr + (safe // PAGE) * stride_vcb + (safe % PAGE) * stride_vcs
    wait_for_previous(USE_PDL)
    # v's [BLOCK_HK, BLOCK_D] tile loads first, so its latency overlaps the q and k heads' work
    offs_h = tl.arange(0, BLOCK_HK)
    cols = tl.arange(0, BLOCK_D)
    v_mask = (offs_h < num_kv)[:, None] & (cols < D)[None, :]
    v = tl.load(v_ptr + tok * stride_vt + offs_h[:, None] * stride_vh + cols[None, :], mask=v_mask)
    q_in, q_out = q_ptr + tok * stride_qt, q_out_ptr + tok * (HQ * D)
    norm_rope_heads(q_in, stride_qh, q_out, D, HQ, qw, qwp, partner, cos, sin, eps, D, BLOCK_HQ, BLOCK_D, ROT)
    k_in = k_ptr + tok * stride_kt
    norm_rope_heads(
        k_in, stride_kh, k_row, stride_kch, num_kv, kw, kwp, partner, cos, sin, eps, D, BLOCK_HK, BLOCK_D, ROT
    )
    tl.store(
        v_row + offs_h[:, None] * stride_vch + cols[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=v_mask
    )


def _tiles(hq: int, hk: int, d: int) -> dict[str, int]:
    """Tile sizes and warps of both kernels: a program holds the token's [BLOCK_HQ, BLOCK_D] q tile."""
    block_d = triton.next_power_of_2(d)
    block_hq = triton.next_power_of_2(hq)
    return dict(
        BLOCK_HQ=block_hq,
        BLOCK_HK=triton.next_power_of_2(hk),
        BLOCK_D=block_d,
        num_warps=max(1, min(8, block_hq * block_d // 512)),
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
    q, k, cos, sin = (unit_dim_stride(t) for t in (q, k, cos, sin))
    q_out = torch.empty((num_tokens, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((num_tokens, hk, d), dtype=k.dtype, device=k.device)
    if num_tokens > 0:
        _qk_norm_rope_kernel[(num_tokens,)](
            q, k, q_weight, k_weight, cos, sin, positions.contiguous(), q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0), eps,
            HQ=hq, HK=hk, D=d, ROT=rotary_dim, **_tiles(hq, hk, d), **launch_options(q),
        )  # fmt: skip
    return q_out, k_out


def qk_norm_rope_store_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    rotary_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """Same contract as ``qk_norm_rope_store_reference``; q, k, v may be strided views (unit dim stride),
    the caches [num_blocks, PAGE, Hk, D] any strides with a unit dim stride."""
    num_tokens, hq, d = q.shape
    hk = k.shape[1]
    q, k, v, cos, sin = (unit_dim_stride(t) for t in (q, k, v, cos, sin))
    q_out = torch.empty((num_tokens, hq, d), dtype=q.dtype, device=q.device)
    if num_tokens > 0:
        _qk_norm_rope_store_kernel[(num_tokens,)](
            q, k, v, q_weight, k_weight, cos, sin, positions.contiguous(), slot_mapping.contiguous(), q_out,
            k_cache, v_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            cos.stride(0), sin.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), eps,
            HQ=hq, HK=hk, D=d, ROT=rotary_dim, PAGE=k_cache.shape[1], **_tiles(hq, hk, d), **launch_options(q),
        )  # fmt: skip
    return q_out
