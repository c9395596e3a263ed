"""Paged decode attention with the new tokens' q/k norm, RoPE and KV store inside: the split kernel of
``triton_decode`` fed straight from the qkv projection, one launch where the model ran ``qk_norm_rope_store``
and then the split kernel.

Inputs: q, k, v [N, H, D] as ``qk_norm_rope_store`` takes them (strided views of the projection's output, unit
dim stride; one token per sequence, row ``cu_seqlens_q[i]``), its norm weights, RoPE tables, ``positions`` and
``slot_mapping``, then the paged decode's operands. Grid and partitions as the plain split kernel.

Each program normalises and rotates the G query heads of its KV head (``norm_rope_tile``: the unfused kernel's
code, so the dot sees the same bits). The program whose partition holds the new token (position ctx - 1) also
normalises and rotates its KV head's k, writes it and the raw v into the token's cache slot (skipped for a
negative slot, as ``qk_norm_rope_store`` does) and reads them back with the older keys of its tiles after a CTA
barrier; no other program reads that row, so none waits. Then ``attend_partition``, and the plain reduce when
the partitions are not merged in the kernel. Before the PDL wait: the step inputs and the block ids (as the
plain kernel), the position, the slot and the RoPE tables and norm weights (no kernel writes them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.attention.triton_decode import (
    LOG2E,
    attend_partition,
    decode_launch,
    head_tiles,
    partition_of,
    reduce_partitions,
)
from hyserve.kernels.contracts import unit_dim_stride
from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.qk_norm_rope.triton_kernel import norm_rope_heads, norm_rope_tile, token_tables


@triton.jit
def _paged_decode_qk_split_kernel(
    q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, bt_ptr,
    seq_lens_ptr, cu_q_ptr, gate_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr, qk_scale, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_st,
    stride_kb, stride_ks, stride_kch, stride_vb, stride_vs, stride_vch, stride_bt,
    stride_gt, stride_gh, stride_gd, stride_ot, stride_oh, num_splits,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, ROT: tl.constexpr, SINGLE: tl.constexpr, FUSED_REDUCE: tl.constexpr,
    MERGE_CHUNK: tl.constexpr, HAS_GATE: tl.constexpr, DOT_PREC: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    seq, kvh, split, ctx, tok, part, start, end, bt_row, blk = partition_of(
        seq_lens_ptr, cu_q_ptr, bt_ptr, stride_bt, num_splits, BLOCK_N, PAGE
    )
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    cos, sin, partner, qw, qwp, kw, kwp = token_tables(
        qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos, stride_ct, stride_st, D, BLOCK_D, ROT
    )
    wait_for_previous(USE_PDL)

    offs_g, offs_d, mask_g, mask_d, heads = head_tiles(kvh, G, G_PAD, D, BLOCK_D)
    q, _, _, _ = norm_rope_tile(q_ptr + tok * stride_qt + kvh * G * stride_qh, stride_qh, G, qw, qwp, partner, cos,
                                sin, eps, D, G_PAD, BLOCK_D, ROT, q_ptr.dtype.element_ty)  # fmt: skip
    q = q.to(q_ptr.dtype.element_ty)
    new = ctx - 1  # the new token's position: it is in exactly one partition
    if (start <= new) & (new < end) & (slot >= 0):
        # its K head into the slot row (a two-row tile, the smallest; the second masked)
        k_dst = k_cache_ptr + (slot // PAGE) * stride_kb + (slot % PAGE) * stride_ks + kvh * stride_kch
        norm_rope_heads(k_ptr + tok * stride_kt + kvh * stride_kh, stride_kh, k_dst, stride_kch, 1, kw, kwp, partner,
                        cos, sin, eps, D, 2, BLOCK_D, ROT)  # fmt: skip
        v_new = tl.load(v_ptr + tok * stride_vt + kvh * stride_vh + offs_d, mask=mask_d, other=0.0)
        v_dst = v_cache_ptr + (slot // PAGE) * stride_vb + (slot % PAGE) * stride_vs + kvh * stride_vch
        tl.store(v_dst + offs_d, v_new.to(v_cache_ptr.dtype.element_ty), mask=mask_d)
        tl.debug_barrier()  # the row's stores before this program's tile loads read it back
    attend_partition(
        q, k_cache_ptr, v_cache_ptr, bt_row, blk, seq, kvh, split, ctx, tok, part, start, end, heads, offs_g, offs_d,
        mask_g, mask_d, gate_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr, qk_scale, stride_kb, stride_ks,
        stride_kch, stride_vb, stride_vs, stride_vch, stride_gt, stride_gh, stride_gd, stride_ot, stride_oh,
        num_splits, G, G_PAD, D, BLOCK_D, BLOCK_N, PAGE, SINGLE, FUSED_REDUCE, MERGE_CHUNK, HAS_GATE, DOT_PREC,
    )  # fmt: skip


def paged_decode_qk(
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
    """``qk_norm_rope_store`` of the new tokens, then ``paged_decode`` of their normed, rotated q, in one split
    kernel (plus the reduce when the partitions are not merged in it); returns ``out`` [N, Hq, D]. The keyword
    arguments are ``paged_decode``'s."""
    num_tokens, num_heads, head_dim = q.shape
    if out is None:
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if seq_lens.shape[0] == 0:
        return out
    q, k, v, cos, sin = (unit_dim_stride(t) for t in (q, k, v, cos, sin))
    launch = decode_launch(
        q, k_cache, seq_lens, block_tables, gate, max_seq_len, out, num_splits, block_n, waves, fused_reduce
    )
    _paged_decode_qk_split_kernel[launch.grid](
        q, k, v, q_weight, k_weight, cos, sin, positions.contiguous(), slot_mapping.contiguous(), k_cache, v_cache,
        block_tables, seq_lens, cu_seqlens_q, launch.gate_arg, out, launch.part_o, launch.part_lse, launch.counters,
        scale * LOG2E, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        *launch.gate_strides,
        out.stride(0), out.stride(1), launch.splits,
        **launch.meta, ROT=rotary_dim, num_warps=num_warps, num_stages=num_stages, **launch_options(q),
    )  # fmt: skip
    reduce_partitions(launch, seq_lens, cu_seqlens_q, out)
    return out
