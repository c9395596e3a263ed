"""Probe: the 12-bit packed GEMV (``kernels/packed_bf16``) on tensor cores instead of FMAs.

The packed GEMV (``linear/triton_packed.py``) issues ~69 SASS instructions an 8-element group and Nsight
Compute finds its schedulers busy 77-84% of cycles (docs/performance.md, "Lossless 12-bit weights"): bound by
instructions, not bytes. Most of them widen the weights and x to fp32 for the FMAs. This probe skips the
widening: the decode's byte permutes already yield bf16 pair words (``pair_words``), which go to ``tl.dot`` as they are, with x
(M <= 16 rows) padded to 16 rows; the pairs' element order within a group ([0, 2, 4, 6, 1, 3, 5, 7] after the
tile's reshape) is matched by gathering x in that order. Two operand orders:

- ``xa``: x the dot's A operand [16, BLOCK_K], the weight tile B (mma.sync in the sm_90 build);
- ``wa``: the weight tile A [BLOCK_N, BLOCK_K] (BLOCK_N >= 64: wgmma), x^T B; PREFETCH requests the next
  tile's words before this one's decode and dot.

The sm_90 builds' loops take 38-45 (``xa``) and 21-31 (``wa``) instructions a group, against 69 for the FMA
kernel. Escapes are corrected as in the FMA kernel. ``check`` compares both with x @ W^T in fp32 (the
interpreter widens the tile to fp32 instead: it has no bf16 bitcasts); ``bench`` times them on the H200 against
the bf16 GEMV plan and the packed FMA plan at the model's four GEMV shapes (L2-cold weights).

usage: PYTHONPATH=src python scripts/probe_packed_dot_gemv.py check|bench
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from hyserve.kernels.packed_bf16 import PackedBF16, pack_bf16
from hyserve.kernels.packed_bf16.triton_kernel import escape_entries, escape_sum, pair_words


@triton.jit
def _dot_gemv(x_ptr, low_ptr, nib_ptr, base_ptr, eptr_ptr, erow_ptr, ecol_ptr, eval_ptr, y_ptr, M, N, K,
              stride_xm, stride_ym, W_IS_A: tl.constexpr, ONE_ROW: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, ESCAPES: tl.constexpr, ASM: tl.constexpr, PREFETCH: tl.constexpr):  # fmt: skip
    BG: tl.constexpr = BLOCK_K // 8
    pid = tl.program_id(0)
    row0 = pid * BLOCK_N
    rn = row0 + tl.arange(0, BLOCK_N)
    nm = rn < N
    rows = tl.where(nm, rn, 0).to(tl.int64)
    gg = tl.arange(0, BG)
    nib_ptrs = nib_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None] * (K // 8) + gg[None, :]
    low_ptrs = low_ptr.to(tl.pointer_type(tl.uint64)) + rows[:, None] * (K // 8) + gg[None, :]
    base4 = tl.load(base_ptr + rows).to(tl.uint32)[:, None] * 0x01010101
    xm = tl.arange(0, 16)
    mm = xm < M
    vk = tl.arange(0, BLOCK_K)
    real = (
        (vk & ~7) + ((vk & 3) << 1) + ((vk >> 2) & 1)
    )  # the tile's column j holds element real[j] of its group
    p_start = tl.load(eptr_ptr + row0)
    p_end = tl.load(eptr_ptr + tl.minimum(row0 + BLOCK_N, N))
    erow, ecol, delta = escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p_start, p_end, ESCAPES)
    x_rows = x_ptr + xm.to(tl.int64)[:, None] * stride_xm
    esc = escape_sum(erow, ecol, delta, x_rows, x_ptr, rn, mm, row0, 0, False, False)
    if W_IS_A:
        acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    else:
        acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    nib_n = tl.load(nib_ptrs)
    low_n = tl.load(low_ptrs)
    for k0 in range(0, K, BLOCK_K):
        nib = nib_n
        low = low_n
        if PREFETCH:
            more = gg[None, :] * 0 + k0 + BLOCK_K < K
            nib_n = tl.load(nib_ptrs + BG, mask=more, other=0)
            low_n = tl.load(low_ptrs + BG, mask=more, other=0)
        if ONE_ROW:
            xv = tl.load(x_ptr + k0 + real)
            xt = tl.where((xm == 0)[:, None], xv[None, :], 0.0).to(x_ptr.dtype.element_ty)
        else:
            xt = tl.load(x_rows + k0 + real[None, :], mask=mm[:, None], other=0.0)
        p0, p1, p2, p3 = pair_words(nib, low.to(tl.uint32), (low >> 32).to(tl.uint32), base4, ASM)
        words = tl.join(tl.join(p0, p1), tl.join(p2, p3))  # [BN, BG, 2, 2]: p0, p2, p1, p3 in the last axes
        if ASM:  # each word's two bf16 as they are
            lo = (words & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
            hi = (words >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:  # the interpreter: the same values widened to fp32, an fp32 dot
            lo = (words << 16).to(tl.float32, bitcast=True)
            hi = ((words >> 16) << 16).to(tl.float32, bitcast=True)
            xt = xt.to(tl.float32)
        w = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
        if W_IS_A:
            acc = tl.dot(w, tl.trans(xt), acc)
        else:
            acc = tl.dot(xt, tl.trans(w), acc)
        nib_ptrs += BG
        low_ptrs += BG
        if not PREFETCH:
            nib_n = tl.load(nib_ptrs, mask=gg[None, :] * 0 + k0 + BLOCK_K < K, other=0)
            low_n = tl.load(low_ptrs, mask=gg[None, :] * 0 + k0 + BLOCK_K < K, other=0)
    for p in range(p_start + ESCAPES, p_end, ESCAPES):  # escapes past the first load of them (rare)
        erow, ecol, delta = escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p, p_end, ESCAPES)
        esc += escape_sum(erow, ecol, delta, x_rows, x_ptr, rn, mm, row0, 0, False, False)
    out = (tl.trans(acc) if W_IS_A else acc) + esc
    tl.store(y_ptr + xm[:, None] * stride_ym + rn[None, :], out.to(y_ptr.dtype.element_ty),
             mask=mm[:, None] & nm[None, :])  # fmt: skip


def dot_gemv(
    x: torch.Tensor, w: PackedBF16, tile: tuple, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """x [M <= 16, K] @ W^T -> [M, N]; tile = (order "xa" / "wa", BLOCK_N, BLOCK_K, num_warps, PREFETCH)."""
    order, bn, bk, warps, prefetch = tile
    m, k = x.shape
    n = w.shape[0]
    if m > 16 or k % bk:
        raise ValueError(
            f"dot_gemv takes at most 16 rows of x and BLOCK_K dividing K, got M={m}, K={k}, BK={bk}"
        )
    y = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    _dot_gemv[(triton.cdiv(n, bn),)](
        x, *w.operands, y, m, n, k, x.stride(0), y.stride(0), W_IS_A=order == "wa", ONE_ROW=m == 1, BLOCK_N=bn,
        BLOCK_K=bk, ESCAPES=16, ASM=x.is_cuda, PREFETCH=prefetch, num_warps=warps, num_stages=1,
    )  # fmt: skip
    return y


TILES = [("xa", 32, 256, 4, False), ("xa", 64, 128, 4, False), ("wa", 64, 128, 4, False), ("wa", 64, 128, 4, True),
         ("wa", 64, 256, 4, True), ("wa", 128, 128, 8, True), ("wa", 64, 64, 4, True)]  # fmt: skip


def check() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    for n, k, m, tile in ((64, 256, 1, ("xa", 32, 128, 4, False)), (96, 512, 3, ("wa", 64, 256, 4, True)),
                          (128, 256, 16, ("wa", 64, 128, 4, False)), (64, 256, 16, ("xa", 64, 128, 4, True))):  # fmt: skip
        wt = (torch.randn(n, k, generator=gen) * k**-0.5).bfloat16()
        wt[3, :40] = 0.0  # escapes: zeros and values far below their row's window
        wt[7, 5::7] = 1e-30
        x = torch.randn(m, k, generator=gen).bfloat16()
        wt, x = wt.to(dev), x.to(dev)
        p = pack_bf16(wt)
        got = dot_gemv(x, p, tile, out_dtype=torch.float32)
        ref = x.float() @ wt.float().T
        err = ((got - ref).norm() / ref.norm()).item()
        print(f"{n}x{k} M={m} {tile}: {p.escapes} escapes, rel err {err:.2e}")
        if not err < (1e-5 if dev == "cpu" else 1e-3):  # the GPU sums in a dot's order
            raise SystemExit(f"wrong: rel err {err}")


def bench() -> None:
    from hyserve.kernels.gated_delta_rule.bench import COLD_BYTES, Cycle, time_ms
    from hyserve.kernels.linear import gemv_plan, packed_gemv_plan
    from hyserve.kernels.linear.triton_kernel import gemv_triton
    from hyserve.kernels.linear.triton_packed import gemv_packed_triton

    for n, k in ((12608, 2048), (9472, 2048), (2048, 4096), (2304, 4096)):
        gen = torch.Generator(device="cuda").manual_seed(n + k)
        copies = max(1, min(32, COLD_BYTES // (n * k * 2)))
        xs = [torch.randn(1, k, device="cuda", generator=gen).bfloat16() for _ in range(copies)]
        ws = [(torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).bfloat16() for _ in range(copies)]
        ps = [pack_bf16(w) for w in ws]
        base = time_ms(Cycle(gemv_triton, list(zip(xs, ws)), cfg=gemv_plan(n, k))) * 1e3
        fma = time_ms(Cycle(gemv_packed_triton, list(zip(xs, ps)), cfg=packed_gemv_plan(n, k))) * 1e3
        print(f"{n}x{k}: bf16 plan {base:.1f} us, packed FMA plan {fma:.1f} us", flush=True)
        for tile in TILES:
            us = time_ms(Cycle(lambda x, p, tile=tile, **kw: dot_gemv(x, p, tile), list(zip(xs, ps)))) * 1e3
            print(f"  {tile}: {us:.1f} us, x{us / base:.2f} the bf16 plan", flush=True)


if __name__ == "__main__":
    {"check": check, "bench": bench}[sys.argv[1]]()
