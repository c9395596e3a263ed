"""Device-side pieces of the 12-bit bf16 format (``packed_bf16``), for the kernels that stream it.

The unit is a group of 8 consecutive elements of a row: one 32-bit word of codes (byte i holds the codes of
elements 2i and 2i + 1, low nibble first) and two words of low bytes (elements 0-3, 4-7). A tile is a
[rows, groups] grid of such words, one group a thread, so the three loads share one layout and the decode is
arithmetic on 32-bit words, four bytes at a time. No element moves between threads: a first version held
[rows, 2C] byte tiles and restored the order with ``tl.interleave``, which went through shared memory with a
barrier a tile and took ~12 integer operations an element (sm_90 SASS).

The decode of a group (``decode_group``): the codes' high bytes ``code + base + 15 (code & 8)`` for four
elements a word (3 operations), then one ``prmt`` (byte permute) a pair of elements puts each element's high
and low byte side by side as a bf16 pair, and a shift or a mask makes each half an fp32: ~2.6 integer
operations an element. On the CPU interpreter, which runs no inline PTX, ``_permute`` computes the same bytes
with shifts and masks (``ASM=False``).

Also here, for every kernel that streams the format: x (or a norm weight) in the same 8-element groups
(``group_ptrs``, ``group_values``, ``advance_groups``: bf16 as 64-bit words split exactly by shifts), and the
escapes of a block of rows (``escape_entries``, ``escape_sum``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _permute(a, b, SEL: tl.constexpr, ASM: tl.constexpr):
    """PTX ``prmt.b32 d, a, b, SEL`` on uint32 tensors: byte k of d is byte (SEL >> 4k) & 7 of the 8 bytes
    [b3 b2 b1 b0 a3 a2 a1 a0] (0-3 from a, 4-7 from b)."""
    if ASM:
        out = tl.inline_asm_elementwise(
            f"prmt.b32 $0, $1, $2, {SEL};", "=r,r,r", [a, b], dtype=tl.uint32, is_pure=True, pack=1
        )
    else:
        out = tl.zeros_like(a)
        for k in tl.static_range(4):
            idx = (SEL >> (4 * k)) & 7
            if idx < 4:
                out |= ((a >> (8 * idx)) & 0xFF) << (8 * k)
            else:
                out |= ((b >> (8 * (idx - 4))) & 0xFF) << (8 * k)
    return out


@triton.jit
def bf16_pair_halves(pair):
    """A bf16 pair word [hi | lo] -> (lo, hi) as fp32 (exact: a bf16 is an fp32's top 16 bits)."""
    return (pair << 16).to(tl.float32, bitcast=True), ((pair >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def pair_words(nib, low0, low1, base4, ASM: tl.constexpr):
    """nib, low0, low1 uint32 [R, G] (a group's words), base4 uint32 [R, 1] (each row's window base in all four
    bytes) -> four uint32 [R, G] words of two bf16 each: (w0, w2), (w1, w3), (w4, w6), (w5, w7), low half first
    (an escape decodes to its stand-in v', which ``escape_deltas`` corrects). high = code + base + 15 (code & 8)
    four bytes a word: no byte carries into the next (code <= 15, base <= 120: at most 255)."""
    even = nib & 0x0F0F0F0F  # codes of elements 0, 2, 4, 6
    odd = (nib >> 4) & 0x0F0F0F0F  # 1, 3, 5, 7
    h_even = even + base4 + (even & 0x08080808) * 15
    h_odd = odd + base4 + (odd & 0x08080808) * 15
    p02 = _permute(h_even, low0, 0x1604, ASM)  # [H2 L2 H0 L0]
    p13 = _permute(h_odd, low0, 0x1705, ASM)  # [H3 L3 H1 L1]
    p46 = _permute(h_even, low1, 0x3624, ASM)  # [H6 L6 H4 L4]
    p57 = _permute(h_odd, low1, 0x3725, ASM)  # [H7 L7 H5 L5]
    return p02, p13, p46, p57


@triton.jit
def decode_group(nib, low0, low1, base4, ASM: tl.constexpr):
    """``pair_words`` widened: the group's 8 elements w0..w7 fp32 [R, G]."""
    p02, p13, p46, p57 = pair_words(nib, low0, low1, base4, ASM)
    w0, w2 = bf16_pair_halves(p02)
    w1, w3 = bf16_pair_halves(p13)
    w4, w6 = bf16_pair_halves(p46)
    w5, w7 = bf16_pair_halves(p57)
    return w0, w1, w2, w3, w4, w5, w6, w7


@triton.jit
def escape_deltas(val, base):
    """val [P] fp32 (an escape's true value), base [P] int32 (its row's window) -> w - v' [P] fp32, where v'
    is what the escape's stored code decodes to: its own sign and low byte with h = base."""
    bits = val.to(tl.uint32, bitcast=True)
    stand_in = ((bits >> 31) << 31) | (bits & 0xFF0000) | (base.to(tl.uint32) << 24)
    return val - stand_in.to(tl.float32, bitcast=True)


@triton.jit
def escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p0, p_end, ESCAPES: tl.constexpr):
    """Escape entries p0 .. min(p0 + ESCAPES, p_end): row, col [ESCAPES] int32 (masked: row -1) and the
    correction w - v' [ESCAPES] fp32 (masked: 0)."""
    p = p0 + tl.arange(0, ESCAPES)
    pm = p < p_end
    erow = tl.load(erow_ptr + p, mask=pm, other=-1)
    ecol = tl.load(ecol_ptr + p, mask=pm, other=0)
    val = tl.load(eval_ptr + p, mask=pm, other=0.0)
    delta = escape_deltas(val, tl.load(base_ptr + erow, mask=pm, other=0))
    return erow, ecol, tl.where(pm, delta, 0.0)


@triton.jit
def escape_sum(
    erow, ecol, delta, x_rows, g_ptr, rn, mm, row0, raw_from, HAS_NORM: tl.constexpr, HAS_RAW: tl.constexpr
):
    """[BLOCK_M, BLOCK_N]: sum over the entries (``escape_entries``) of delta x[m, col] at the entry's row
    (one-hot against the program's rows rn; x_rows [BLOCK_M, 1] the rows of x, mm [BLOCK_M] their mask). With
    the norm, x[m, col] (1 + g[col]), except in a raw program (HAS_RAW: its first row row0 >= raw_from)."""
    pm = erow >= 0
    xg = tl.load(x_rows + ecol[None, :], mask=mm[:, None] & pm[None, :], other=0.0).to(tl.float32)
    if HAS_NORM:
        gm = pm
        if HAS_RAW:  # (taken elementwise: the interpreter mis-types a scalar bool & a mask)
            gm = gm & (ecol * 0 + row0 < raw_from)
        g = tl.load(g_ptr + ecol, mask=gm, other=0.0)
        xg = xg * (1.0 + g.to(tl.float32))[None, :]
    hit = (erow[:, None] == rn[None, :]).to(tl.float32)  # [ESCAPES, BLOCK_N]
    return tl.sum((xg * delta[None, :])[:, :, None] * hit[None, :, :], axis=1)


@triton.jit
def group_ptrs(ptr, pair0):
    """Where the 8 elements from element 2 * pair0 on load from, pair0 [A, B, G] int64: bf16, the group's first
    8 bytes as one 64-bit word (the next 8 are the word after it); other dtypes (the CPU tests' fp32 / fp16),
    the first element. Both [A, B, G]: the same shape as the weight's words, so Triton gives the loads one
    layout (a [.., 4] tile of 32-bit words took its own and shuffled the products through shared memory)."""
    if ptr.dtype.element_ty == tl.bfloat16:
        ptrs = ptr.to(tl.pointer_type(tl.uint64)) + pair0 // 2
    else:
        ptrs = ptr + 2 * pair0
    return ptrs


@triton.jit
def group_values(ptrs, mask):
    """The 8 elements e0..e7 fp32 [A, B, G] at ``group_ptrs`` (mask [A, B, G] or broadcastable)."""
    if ptrs.dtype.element_ty == tl.uint64:  # bf16 pairs: split by shifts, exact
        first = tl.load(ptrs, mask=mask, other=0)
        last = tl.load(ptrs + 1, mask=mask, other=0)
        e0, e1 = bf16_pair_halves(first.to(tl.uint32))
        e2, e3 = bf16_pair_halves((first >> 32).to(tl.uint32))
        e4, e5 = bf16_pair_halves(last.to(tl.uint32))
        e6, e7 = bf16_pair_halves((last >> 32).to(tl.uint32))
    else:
        e0 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        e1 = tl.load(ptrs + 1, mask=mask, other=0.0).to(tl.float32)
        e2 = tl.load(ptrs + 2, mask=mask, other=0.0).to(tl.float32)
        e3 = tl.load(ptrs + 3, mask=mask, other=0.0).to(tl.float32)
        e4 = tl.load(ptrs + 4, mask=mask, other=0.0).to(tl.float32)
        e5 = tl.load(ptrs + 5, mask=mask, other=0.0).to(tl.float32)
        e6 = tl.load(ptrs + 6, mask=mask, other=0.0).to(tl.float32)
        e7 = tl.load(ptrs + 7, mask=mask, other=0.0).to(tl.float32)
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def advance_groups(ptrs, BLOCK_K: tl.constexpr):
    """``group_ptrs`` one tile (BLOCK_K elements) on."""
    if ptrs.dtype.element_ty == tl.uint64:
        ptrs += BLOCK_K // 4
    else:
        ptrs += BLOCK_K
    return ptrs
