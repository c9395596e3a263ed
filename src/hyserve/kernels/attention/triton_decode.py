"""Paged decode attention (flash-decoding): one query token per sequence over a paged KV cache, GQA.

Shapes: q [T=N, Hq, D] (row ``cu_seqlens_q[i]`` is sequence i's token), k_cache/v_cache
[num_blocks, PAGE, Hkv, D], block_tables [N, max_blocks] int32, seq_lens [N] int32, gate None or
[T, Hq * D] / [T, Hq, D] (any strides), out [T, Hq, D].

Grid of the split kernel: (N, Hkv, num_splits). A program takes *all* G = Hq / Hkv query heads of one
KV head, so each K/V row is read from HBM once per KV head: the scores are a [G_PAD, D] x [D, BLOCK_N]
tensor-core dot (G padded to 16, the smallest dot M) and the values a [G_PAD, BLOCK_N] x [BLOCK_N, D] one.
Sequence i's context is cut on the device into num_splits equal partitions (rounded up to BLOCK_N), so
the grid depends only on host ints (N and a split count chosen from the batch size and the maximum
context) and the kernel is CUDA-graph safe: short sequences leave their trailing partitions empty.
Online softmax in fp32 (base 2, the scale pre-multiplied by log2(e)).

num_splits == 1 (SINGLE): the program normalises, applies the sigmoid gate and writes ``out`` (one pass).
num_splits > 1: it writes its normalised partial output [N, Hq, S, D] fp32 and log2-sum-exp [N, Hq, S];
the reduce kernel (grid (N, Hq)) merges the non-empty partitions and applies the gate. With FUSED_REDUCE
there is no reduce launch: each program then draws a ticket of its (sequence, KV head)'s counter
(kernels/tickets.py) and the one that draws the last merges the partitions of its G heads, applies the
gate and resets the counter (docs/kernels.md, last-program reductions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.tickets import ticket_counters


@triton.jit
def _gate_store(
    o,
    gate_ptr,
    out_ptr,
    tok,
    heads,
    offs_d,
    mask,
    stride_gt,
    stride_gh,
    stride_gd,
    stride_ot,
    stride_oh,
    HAS_GATE: tl.constexpr,
):
    """out[tok, heads] = o * sigmoid(gate[tok, heads]) (o [G_PAD, BLOCK_D] fp32; without HAS_GATE, o)."""
    if HAS_GATE:
        g = tl.load(
            gate_ptr + tok * stride_gt + heads[:, None] * stride_gh + offs_d[None, :] * stride_gd,
            mask=mask,
            other=0.0,
        ).to(tl.float32)
        o = o / (1.0 + tl.exp(-g))
    tl.store(
        out_ptr + tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def _merge_partitions(
    part_o_ptr,
    part_lse_ptr,
    rows,
    mask_g,
    offs_d,
    mask_d,
    used,
    D: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """The softmax-weighted mean [G_PAD, BLOCK_D] fp32 of partitions 0..used-1 of G_PAD heads, whose partition 0
    sits at rows [G_PAD] of [N, Hq, S]: an online merge (running max, sum and weighted sum, base 2), one
    [G_PAD, BLOCK_D] partial at a time, elementwise (no reduction, no layout change). The loop body is unrolled
    over CHUNK partitions so that their loads (.cg: other programs wrote them) are in flight together."""
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    den = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, BLOCK_D], tl.float32)
    for s0 in range(0, used, CHUNK):
        for c in tl.static_range(CHUNK):
            # the partition index as a [G_PAD] tensor: the interpreter mis-types a scalar bool & [G_PAD] mask
            s = tl.full([G_PAD], s0 + c, tl.int32)
            idx = rows + s
            ok = mask_g & (s < used)
            lse = tl.load(part_lse_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(
                part_o_ptr + idx[:, None] * D + offs_d[None, :],
                mask=ok[:, None] & mask_d[None, :],
                other=0.0,
                cache_modifier=".cg",
            )
            m_new = tl.maximum(m, lse)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padding heads, chunk tail: weight 0
            alpha = tl.exp2(m - m_safe)
            w = tl.exp2(lse - m_safe)
            den = den * alpha + w
            acc = acc * alpha[:, None] + o * w[:, None]
            m = m_new
    return acc / tl.where(den > 0.0, den, 1.0)[:, None]


@triton.jit
def partition_of(
    seq_lens_ptr, cu_q_ptr, bt_ptr, stride_bt, num_splits, BLOCK_N: tl.constexpr, PAGE: tl.constexpr
):
    """This program's (sequence, KV head, partition) and its keys: (seq, kvh, split, the context length, the query
    row ``tok``, the partition length ``part`` (the context cut in num_splits, rounded up to BLOCK_N), its keys
    [start, end), the sequence's block-table row and the first tile's block ids). Only step inputs are read (no
    kernel writes them), so a kernel runs this before its PDL wait."""
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    ctx = tl.load(seq_lens_ptr + seq).to(tl.int32)
    tok = tl.load(cu_q_ptr + seq).to(tl.int64)
    part = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N
    start = split * part
    end = tl.minimum(start + part, ctx)
    bt_row = bt_ptr + seq * stride_bt
    offs_n = start + tl.arange(0, BLOCK_N)
    blk = tl.load(bt_row + offs_n // PAGE, mask=offs_n < end, other=0).to(tl.int64)
    return seq, kvh, split, ctx, tok, part, start, end, bt_row, blk


@triton.jit
def head_tiles(kvh, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """The [G_PAD, BLOCK_D] q tile's row and column offsets, their masks and the query heads (int64) of KV head
    ``kvh``."""
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    return offs_g, offs_d, offs_g < G, offs_d < D, kvh * G + offs_g


@triton.jit
def attend_partition(
    q, k_ptr, v_ptr, bt_row, blk, seq, kvh, split, ctx, tok, part, start, end, heads, offs_g, offs_d, mask_g, mask_d,
    gate_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb,
    stride_vs, stride_vh, stride_gt, stride_gh, stride_gd, stride_ot, stride_oh, num_splits,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, SINGLE: tl.constexpr, FUSED_REDUCE: tl.constexpr, MERGE_CHUNK: tl.constexpr,
    HAS_GATE: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """A split program's work once its q tile [G_PAD, BLOCK_D] is in registers: the online softmax over keys
    [start, end) of KV head ``kvh`` (``blk``: the first tile's block ids), then the gated output (SINGLE), or the
    partial and, with FUSED_REDUCE, the last program's merge. Shared by the plain split kernel and the one with the
    q/k norm, RoPE and KV store (``triton_decode_qk.py``)."""
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, BLOCK_D], tl.float32)
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        in_page = (offs_n % PAGE).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(
            k_base + (blk * stride_kb + in_page * stride_ks)[:, None] + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [G_PAD, BLOCK_N], log2 units
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + (blk * stride_vb + in_page * stride_vs)[:, None] + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new
        nxt = offs_n + BLOCK_N  # the next tile's block ids (rotated: the first loaded before the wait)
        blk = tl.load(bt_row + nxt // PAGE, mask=nxt < end, other=0).to(tl.int64)

    nonempty = l_i > 0.0
    o = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    out_mask = mask_g[:, None] & mask_d[None, :]
    if SINGLE:
        _gate_store(o, gate_ptr, out_ptr, tok, heads, offs_d, out_mask, stride_gt, stride_gh, stride_gd,
                    stride_ot, stride_oh, HAS_GATE)  # fmt: skip
    else:
        lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        rows = (seq * (G * tl.num_programs(1)) + heads) * num_splits  # [G_PAD] partition 0's [N, Hq, S] index
        tl.store(part_lse_ptr + rows + split, lse, mask=mask_g)
        tl.store(part_o_ptr + (rows + split)[:, None] * D + offs_d[None, :], o, mask=out_mask)
        if FUSED_REDUCE:
            # every program draws a ticket, empty partitions included, so the count always reaches num_splits;
            # the barrier puts all of this program's stores before the release
            counter = counter_ptr + seq * tl.num_programs(1) + kvh
            tl.debug_barrier()
            ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:
                used = tl.cdiv(ctx, tl.maximum(part, 1))  # as in the reduce kernel (0 for an empty context)
                o = _merge_partitions(part_o_ptr, part_lse_ptr, rows, mask_g, offs_d, mask_d, used, D, G_PAD,
                                      BLOCK_D, MERGE_CHUNK)  # fmt: skip
                _gate_store(o, gate_ptr, out_ptr, tok, heads, offs_d, out_mask, stride_gt, stride_gh, stride_gd,
                            stride_ot, stride_oh, HAS_GATE)  # fmt: skip
                tl.store(counter, 0)  # every ticket of this launch is drawn: the next launch starts from 0


@triton.jit
def _paged_decode_split_kernel(
    q_ptr,
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
    num_splits,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    SINGLE: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    MERGE_CHUNK: tl.constexpr,
    HAS_GATE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    USE_PDL: tl.constexpr,
):

    # seq_lens, cu_seqlens_q and the block tables are the step's inputs, copied in before its first kernel
    # (no kernel writes them): they and the first tile's block ids load while the previous kernel finishes
    # (kernels/pdl.py); q and the K/V rows (the new token's written by the previous kernel) after the wait
    seq, kvh, split, ctx, tok, part, start, end, bt_row, blk = partition_of(
        seq_lens_ptr, cu_q_ptr, bt_ptr, stride_bt, num_splits, BLOCK_N, PAGE
    )
    wait_for_previous(USE_PDL)

    offs_g, offs_d, mask_g, mask_d, heads = head_tiles(kvh, G, G_PAD, D, BLOCK_D)
    q = tl.load(
        q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_g[:, None] & mask_d[None, :],
        other=0.0,
    )

    attend_partition(
        q, k_ptr, v_ptr, bt_row, blk, seq, kvh, split, ctx, tok, part, start, end, heads, offs_g, offs_d, mask_g,
        mask_d, gate_ptr, out_ptr, part_o_ptr, part_lse_ptr, counter_ptr, qk_scale, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_gt, stride_gh, stride_gd, stride_ot, stride_oh, num_splits, G, G_PAD,
        D, BLOCK_D, BLOCK_N, PAGE, SINGLE, FUSED_REDUCE, MERGE_CHUNK, HAS_GATE, DOT_PREC,
    )  # fmt: skip


@triton.jit
def _paged_decode_reduce_kernel(
    part_o_ptr,
    part_lse_ptr,
    seq_lens_ptr,
    cu_q_ptr,
    gate_ptr,
    out_ptr,
    stride_gt,
    stride_gh,
    stride_gd,
    stride_ot,
    stride_oh,
    num_splits,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S_PAD: tl.constexpr,
    HAS_GATE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    num_heads = tl.num_programs(1)
    # step inputs (see the split kernel) load before the wait; the partials and the gate after it
    ctx = tl.load(seq_lens_ptr + seq).to(tl.int32)
    tok = tl.load(cu_q_ptr + seq).to(tl.int64)
    wait_for_previous(USE_PDL)
    part = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N
    used = tl.cdiv(ctx, tl.maximum(part, 1))  # partitions holding keys (0 for an empty context)

    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < used
    mask_d = offs_d < D
    row = (seq * num_heads + head) * num_splits + offs_s
    lse = tl.load(part_lse_ptr + row, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(mask_s, tl.exp2(lse - m), 0.0)
    o = tl.load(
        part_o_ptr + row[:, None] * D + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0
    )
    denom = tl.sum(w, 0)
    o = tl.sum(o * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
    if HAS_GATE:
        g = tl.load(
            gate_ptr + tok * stride_gt + head * stride_gh + offs_d * stride_gd, mask=mask_d, other=0.0
        )
        o = o / (1.0 + tl.exp(-g.to(tl.float32)))
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=mask_d
    )


LOG2E = 1.4426950408889634
SINGLE_PASS_CTX = 256  # contexts up to this many keys never split
MIN_SPLIT_TOKENS = 128  # a partition should hold at least this many keys at the maximum context
MAX_SPLITS = 64
# partitions whose [G_PAD, BLOCK_D] fp32 partials the fused merge has in flight at once: at the model's shapes
# (sm_90, Triton 3.6) ptxas issues all 4 partitions' loads before their math and the kernel stays within the
# unfused split kernel's registers (224 against 228: the same occupancy); at 8 it no longer hoists them all
MERGE_CHUNK = 4
_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (132 on an H200; also used on the CPU interpreter)."""
    if device.type != "cuda":
        return 132
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_ctx: int, device: torch.device, waves: float
) -> int:
    """Partitions per (sequence, KV head): enough programs for ``waves`` programs per SM, none for short contexts."""
    if max_ctx <= SINGLE_PASS_CTX:
        return 1
    target = triton.cdiv(int(waves * sm_count(device)), max(1, num_seqs * num_kv_heads))
    return max(1, min(target, triton.cdiv(max_ctx, MIN_SPLIT_TOKENS), MAX_SPLITS))


def gate_strides(gate: torch.Tensor | None, num_heads: int, head_dim: int) -> tuple[int, int, int]:
    """(token, head, dim) strides of the gate seen as [T, Hq, D]; zeros without a gate."""
    if gate is None:
        return 0, 0, 0
    if gate.dim() == 3:
        return gate.stride(0), gate.stride(1), gate.stride(2)
    return gate.stride(0), head_dim * gate.stride(1), gate.stride(1)


@dataclass(frozen=True)
class DecodeLaunch:
    """What a split kernel's launch and the reduce after it share (``decode_launch``): the grid, the tiles, the
    gate's strides and the partials. Tensors are device buffers; the rest host ints and flags."""

    num_seqs: int
    num_kv_heads: int
    splits: int  # partitions per (sequence, KV head): the grid's last axis
    fused: bool  # the split kernel's last program merges (no reduce launch)
    meta: (
        dict  # the split kernel's constexprs: G, G_PAD, D, BLOCK_D, BLOCK_N, PAGE, SINGLE, FUSED_REDUCE, ...
    )
    gate_arg: torch.Tensor  # the gate, or any tensor when there is none (unused)
    gate_strides: tuple[int, int, int]  # (token, head, dim) of the gate seen as [T, Hq, D]
    part_o: torch.Tensor  # [N, Hq, S, D] fp32 partials (``out`` when unsplit: unused)
    part_lse: torch.Tensor  # [N, Hq, S] fp32 base-2 log-sum-exps
    counters: torch.Tensor  # [N * Hkv] int32 tickets when fused, else any int32 tensor (unused)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.num_seqs, self.num_kv_heads, self.splits)


def decode_launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    gate: torch.Tensor | None,
    max_seq_len: int | None,
    out: torch.Tensor,
    num_splits: int | None,
    block_n: int,
    waves: float,
    fused_reduce: bool,
) -> DecodeLaunch:
    """The grid, tiles and partial buffers of a decode attention of q [N, Hq, D] over the cache (see
    ``paged_decode``, whose arguments these are)."""
    num_seqs, num_heads, head_dim = seq_lens.shape[0], q.shape[1], q.shape[2]
    page, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_ctx = max_seq_len if max_seq_len is not None else block_tables.shape[1] * page
    splits = num_splits or choose_num_splits(num_seqs, num_kv_heads, max_ctx, q.device, waves)
    fused = fused_reduce and splits > 1
    if splits == 1:
        part_o = part_lse = out  # unused
    else:
        part_o = torch.empty((num_seqs, num_heads, splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_seqs, num_heads, splits), dtype=torch.float32, device=q.device)
    meta = dict(
        G=group, G_PAD=max(16, triton.next_power_of_2(group)), D=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_N=block_n, PAGE=page, SINGLE=splits == 1,
        FUSED_REDUCE=fused, MERGE_CHUNK=MERGE_CHUNK, HAS_GATE=gate is not None,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return DecodeLaunch(
        num_seqs=num_seqs,
        num_kv_heads=num_kv_heads,
        splits=splits,
        fused=fused,
        meta=meta,
        gate_arg=gate if gate is not None else q,
        gate_strides=gate_strides(gate, num_heads, head_dim),
        part_o=part_o,
        part_lse=part_lse,
        counters=(ticket_counters("paged_decode", q.device, num_seqs * num_kv_heads) if fused else seq_lens),
    )


def reduce_partitions(
    launch: DecodeLaunch, seq_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, out: torch.Tensor
) -> None:
    """The reduce launch after a split kernel that left its partitions unmerged (split and not fused)."""
    if launch.splits == 1 or launch.fused:
        return
    s_pad = triton.next_power_of_2(launch.splits)
    m = launch.meta
    _paged_decode_reduce_kernel[(launch.num_seqs, out.shape[1])](
        launch.part_o, launch.part_lse, seq_lens, cu_seqlens_q, launch.gate_arg, out,
        *launch.gate_strides,
        out.stride(0), out.stride(1), launch.splits,
        D=m["D"], BLOCK_D=m["BLOCK_D"], BLOCK_N=m["BLOCK_N"], S_PAD=s_pad,
        HAS_GATE=m["HAS_GATE"],
        num_warps=4 if s_pad * m["BLOCK_D"] <= 4096 else 8, **launch_options(out),
    )  # fmt: skip


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
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
    """One query token per sequence (q [N, Hq, D]); returns ``out`` [N, Hq, D]. No host reads of device data.

    The grid is sized from ``max_seq_len`` when given, else from ``block_tables.shape[1] * block_size``.
    ``fused_reduce``: with num_splits > 1, the split kernel's last program per (sequence, KV head) merges the
    partitions instead of a reduce launch. Its ticket counters (kernels/tickets.py) grow only outside CUDA-graph
    capture: run each batch size (with the capture's split count) eagerly first, as the engine does.
    """
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if seq_lens.shape[0] == 0:
        return out
    launch = decode_launch(
        q, k_cache, seq_lens, block_tables, gate, max_seq_len, out, num_splits, block_n, waves, fused_reduce
    )
    _paged_decode_split_kernel[launch.grid](
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, launch.gate_arg, out, launch.part_o,
        launch.part_lse, launch.counters,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        *launch.gate_strides,
        out.stride(0), out.stride(1), launch.splits,
        **launch.meta, num_warps=num_warps, num_stages=num_stages, **launch_options(q),
    )  # fmt: skip
    reduce_partitions(launch, seq_lens, cu_seqlens_q, out)
    return out
