"""The paged decode split kernel with q/k-norm + RoPE and the KV-cache store as its prologue (one launch where
the decode step had two: ``qk_norm_rope_store`` then the split kernel).

Inputs as q_proj / k_proj / v_proj wrote them: q [N, Hq, D], k and v [N, Hkv, D] (strided views, unit dim
stride), one token per sequence. A program (sequence, KV head, split) normalises and rotates its G query
heads itself (``_norm_rope_tile``, the same math and roundings as ``qk_norm_rope_store``, so the result is
bit-identical to the two launches), and the program whose key range holds the new token (position
``ctx - 1``, the last key) first writes that token's normed, rotated k and raw v into the cache slot, then a
CTA barrier makes the rows visible to its own loads. No other program reads that slot, so no ordering across
programs is needed. The attention itself, the partials and the merge are ``triton_decode._split_attend``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.attention.triton_decode import LOG2E, DecodePlan, _split_attend, _split_range
from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.qk_norm_rope.triton_kernel import _norm_rope_heads, _norm_rope_tile, _token_tables


@triton.jit
def _paged_decode_rope_split_kernel(
    q_ptr,
    k_new_ptr,
    v_new_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slot_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    seq_lens_ptr,
    cu_q_ptr,
    gate_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    counter_ptr,
    qk_scale,
    eps,
    stride_qt,
    stride_qh,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    stride_ct,
    stride_st,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_gt,
    stride_gh,
    stride_gd,
    stride_ot,
    stride_oh,
    num_splits,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    ROT: tl.constexpr,
    SINGLE: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    MERGE_CHUNK: tl.constexpr,
    HAS_GATE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    # step inputs and weights (no kernel writes them) load while the previous kernel finishes (kernels/pdl.py);
    # q, k and v, the previous kernel's output, after the wait
    ctx, tok, part, start, end, bt_row, blk = _split_range(
        seq_lens_ptr, cu_q_ptr, bt_ptr, seq, split, stride_bt, num_splits, BLOCK_N, PAGE
    )
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    cos, sin, partner, qw, qwp, kw, kwp = _token_tables(
        qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos, stride_ct, stride_st, D, BLOCK_D, ROT
    )
    owner = (start <= ctx - 1) & (ctx - 1 < end) & (slot >= 0)  # this program's range holds the new key
    safe = tl.maximum(slot, 0)
    cols = tl.arange(0, BLOCK_D)
    wait_for_previous(USE_PDL)
    if owner:
        v = tl.load(v_new_ptr + tok * stride_vnt + kvh * stride_vnh + cols, mask=cols < D)
        k_row = k_ptr + (safe // PAGE) * stride_kb + (safe % PAGE) * stride_ks + kvh * stride_kh
        _norm_rope_heads(k_new_ptr + tok * stride_knt + kvh * stride_knh, stride_knh, k_row, stride_kh, 1,
                         kw, kwp, partner, cos, sin, eps, D, 1, BLOCK_D, ROT)  # fmt: skip
        v_row = v_ptr + (safe // PAGE) * stride_vb + (safe % PAGE) * stride_vs + kvh * stride_vh
        tl.store(v_row + cols, v.to(v_ptr.dtype.element_ty), mask=cols < D)
    q = _norm_rope_tile(q_ptr + tok * stride_qt + kvh * G * stride_qh, stride_qh, G, qw, qwp, partner, cos, sin,
                        eps, q_ptr.dtype.element_ty, D, G_PAD, BLOCK_D, ROT)  # fmt: skip
    tl.debug_barrier()  # the owner's cache rows are written before any of its threads loads them
    _split_attend(q, k_ptr, v_ptr, bt_row, blk, gate_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
                  seq, kvh, split, tok, ctx, part, start, end, qk_scale,
                  stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                  stride_gt, stride_gh, stride_gd, stride_ot, stride_oh, num_splits,
                  G, G_PAD, D, BLOCK_D, BLOCK_N, PAGE, SINGLE, FUSED_REDUCE, MERGE_CHUNK, HAS_GATE,
                  DOT_PREC)  # fmt: skip


def paged_decode_rope(
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
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    *,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    waves: float = 4.0,
    fused_reduce: bool = False,
) -> torch.Tensor:
    """``qk_norm_rope_store`` then ``paged_decode`` in one split launch (plus the reduce unless fused): q
    [N, Hq, D], k, v [N, Hkv, D] raw (strided views with a unit dim stride), one token per sequence; the tables,
    positions [N], slot_mapping [N] and the rest as in those two ops. Returns ``out`` [N, Hq, D]."""
    plan = DecodePlan.make(q, k_cache, seq_lens, block_tables, gate, max_seq_len, out, num_splits, waves,
                           fused_reduce)  # fmt: skip
    if plan.num_seqs == 0:
        return plan.out
    cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    _paged_decode_rope_split_kernel[plan.grid](
        q, k, v, q_weight, k_weight, cos, sin, positions, slot_mapping,
        k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, plan.gate, plan.out, plan.part_o,
        plan.part_lse, plan.counters,
        scale * LOG2E, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        *plan.gate_strides,
        plan.out.stride(0), plan.out.stride(1), plan.splits,
        **plan.constexprs(block_n), ROT=rotary_dim, HAS_GATE=gate is not None,
        num_warps=num_warps, num_stages=num_stages, **launch_options(q),
    )  # fmt: skip
    plan.reduce(seq_lens, cu_seqlens_q, block_n)
    return plan.out
