"""Varlen causal flash attention over a paged KV cache (prefill, chunked prefill, mixed batches), GQA.

Shapes: q [T, Hq, D] packed by ``cu_seqlens_q [N+1]``; k_cache/v_cache [num_blocks, PAGE, Hkv, D];
block_tables [N, max_blocks]; seq_lens [N] (context after this step); gate None or [T, Hq*D] / [T, Hq, D];
out [T, Hq, D]. Query j of sequence i sits at position ``seq_lens[i] - q_len_i + j`` and sees keys
0..position (the cached prefix and the causal part of its own chunk, all read from the cache).

Grid: (T // BLOCK_Q + N, Hkv). A program owns BLOCK_Q consecutive query tokens of one sequence and all
G query heads of one KV head, packed as BLOCK_M = BLOCK_Q * G_PAD rows (row r = token r // G_PAD, head
r % G_PAD), so one K/V tile feeds every head of its group (and one-token rows of a mixed batch do not
waste a whole BLOCK_M tile). Sequence i owns program blocks ``cu_seqlens_q[i] // BLOCK_Q + i`` onwards (at
least ceil(q_len / BLOCK_Q) of them, so the grid bound above holds without reading lengths on the host);
a program finds its sequence by binary search over cu_seqlens_q and exits early if it has no rows.
Blocks run in reverse order so the long (late, causal) blocks start first.

Keys below the block's first query position need no causal mask (first loop); the diagonal band does
(second loop). Online softmax in fp32 (base 2), the sigmoid gate fused in the epilogue.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _find_seq(cu_q_ptr, block, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest i with cu_seqlens_q[i] // BLOCK_Q + i <= block (branch-free binary search)."""
    lo = tl.full((), 0, tl.int32)
    hi = tl.full((), 0, tl.int32) + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(cu_q_ptr + mid).to(tl.int32) // BLOCK_Q + mid
        go_right = first <= block
        lo = tl.where(go_right, mid + 1, lo)
        hi = tl.where(go_right, hi, mid)
    return lo - 1


@triton.jit
def _attend_tile(
    q,
    acc,
    m_i,
    l_i,
    n0,
    hi,
    pos,
    k_base,
    v_base,
    bt_row,
    qk_scale,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    offs_d,
    mask_d,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hi
    blk = tl.load(bt_row + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
    in_page = (offs_n % PAGE).to(tl.int64)
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(
        k_base + (blk * stride_kb + in_page * stride_ks)[:, None] + offs_d[None, :], mask=kv_mask, other=0.0
    )
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
    if CAUSAL:
        s = tl.where((offs_n[None, :] <= pos[:, None]) & mask_n[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        v_base + (blk * stride_vb + in_page * stride_vs)[:, None] + offs_d[None, :], mask=kv_mask, other=0.0
    )
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
    return acc, m_new, l_i


# The sequence count and the block-table width change with every mixed step: not specialised on (a new
# value divisible by 16 or equal to 1 would compile another variant in the middle of serving).
@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _paged_prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    seq_lens_ptr,
    cu_q_ptr,
    gate_ptr,
    out_ptr,
    qk_scale,
    num_seqs,
    stride_qt,
    stride_qh,
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
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_GATE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    block = (tl.num_programs(0) - 1 - tl.program_id(0)).to(tl.int32)
    kvh = tl.program_id(1).to(tl.int64)
    seq = _find_seq(cu_q_ptr, block, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_q_ptr + seq).to(tl.int32)
    q_len = tl.load(cu_q_ptr + seq + 1).to(tl.int32) - q_start
    qb = block - (q_start // BLOCK_Q + seq)  # this program's block within the sequence
    ctx = tl.load(seq_lens_ptr + seq).to(tl.int32)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    tok_in = qb * BLOCK_Q + offs_m // G_PAD  # token index inside the sequence's chunk
    grp = offs_m % G_PAD
    row_ok = (tok_in < q_len) & (grp < G)
    first_pos = ctx - q_len + qb * BLOCK_Q
    # keys this block can see: [0, hi); none when the block has no rows
    hi = tl.minimum(ctx, first_pos + BLOCK_Q)
    hi = tl.where(qb * BLOCK_Q < q_len, hi, 0)
    pos = tl.where(row_ok, ctx - q_len + tok_in, hi - 1)  # padding rows see everything: no empty rows
    full_end = tl.maximum(tl.minimum(first_pos + 1, hi), 0) // BLOCK_N * BLOCK_N

    tok = (q_start + tok_in).to(tl.int64)
    heads = kvh * G + grp
    io_mask = row_ok[:, None] & mask_d[None, :]
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=io_mask,
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, n0, hi, pos, k_base, v_base, bt_row, qk_scale,
            stride_kb, stride_ks, stride_vb, stride_vs, offs_d, mask_d,
            BLOCK_N, PAGE, False, DOT_PREC,
        )  # fmt: skip
    for n0 in range(full_end, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, n0, hi, pos, k_base, v_base, bt_row, qk_scale,
            stride_kb, stride_ks, stride_vb, stride_vs, offs_d, mask_d,
            BLOCK_N, PAGE, True, DOT_PREC,
        )  # fmt: skip

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if HAS_GATE:
        g = tl.load(
            gate_ptr + tok[:, None] * stride_gt + heads[:, None] * stride_gh + offs_d[None, :] * stride_gd,
            mask=io_mask,
            other=0.0,
        ).to(tl.float32)
        o = o / (1.0 + tl.exp(-g))
    tl.store(
        out_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


LOG2E = 1.4426950408889634


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 8,
    num_stages: int = 2,
) -> torch.Tensor:
    """Any mix of prefill, chunked-prefill and decode sequences; returns ``out`` [T, Hq, D].

    ``block_m`` rows per program = ``block_m // G_PAD`` query tokens x G_PAD heads of one KV head.
    """
    from hyserve.kernels.attention.triton_decode import gate_strides

    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    page, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0 or num_tokens == 0:
        return out
    g_pad = triton.next_power_of_2(group)
    block_m = max(block_m, g_pad, 16)
    block_q = block_m // g_pad
    block_d = max(16, triton.next_power_of_2(head_dim))
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
    sg = gate_strides(gate, num_heads, head_dim)
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, gate if gate is not None else q, out,
        scale * LOG2E, num_seqs,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        *sg,
        out.stride(0), out.stride(1),
        G=group, G_PAD=g_pad, D=head_dim, BLOCK_D=block_d, BLOCK_Q=block_q, BLOCK_N=block_n, PAGE=page,
        HAS_GATE=gate is not None, DOT_PREC=dot_prec,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
