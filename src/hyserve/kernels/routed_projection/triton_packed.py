"""The out-projection that also routes (``triton_kernel.py``) over [M; W_o] in the 12-bit bf16 format.

The same grid over the rows of [M; W_o] [E + H, Hv] (M's first, in M_SPLIT column slices), one row a program,
and the same end (``_route_or_store``: M's partial logits, the ticket and the last program's top-k; W_o's h1
in place). The K loop is the packed GEMV's (``linear/triton_packed.py``): [1 row, BLOCK_K / 8 groups] tiles, a
group a thread (BLOCK_K = 256 x num_warps), the first two tiles and the row's escapes loaded before the PDL
wait; an escape outside the program's column slice adds nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require
from hyserve.kernels.linear.triton_packed import _packed_tile
from hyserve.kernels.packed_bf16 import PackedBF16
from hyserve.kernels.packed_bf16.triton_kernel import (
    advance_groups,
    decode_group,
    escape_entries,
    escape_sum,
    group_ptrs,
)
from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.routed_projection.triton_kernel import _route_or_store
from hyserve.kernels.tickets import ticket_counters


@triton.jit
def _slice_escapes(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p0, p_end, k_lo, k_hi, ESCAPES: tl.constexpr):
    """``escape_entries`` with the entries outside columns [k_lo, k_hi) zeroed."""
    erow, ecol, delta = escape_entries(erow_ptr, ecol_ptr, eval_ptr, base_ptr, p0, p_end, ESCAPES)
    return erow, ecol, tl.where((ecol >= k_lo) & (ecol < k_hi), delta, 0.0)


@triton.jit
def _project_route_packed_kernel(
    a_ptr,
    low_ptr,
    nib_ptr,
    base_ptr,
    eptr_ptr,
    erow_ptr,
    ecol_ptr,
    eval_ptr,
    h_ptr,
    part_ptr,
    raw_ptr,
    counter_ptr,
    ids_ptr,
    top_ptr,
    H,
    K,
    E,
    BLOCK_K: tl.constexpr,
    ESCAPES: tl.constexpr,
    M_SPLIT: tl.constexpr,
    EP: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    ASM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One row a program; (K / M_SPLIT) % BLOCK_K == 0 (``project_out_route_packed``)."""
    BG: tl.constexpr = BLOCK_K // 8
    pid = tl.program_id(0)
    n_route = M_SPLIT * E  # programs of M's rows (slice-major); the rest take W_o's
    is_route = pid < n_route
    part = tl.where(is_route, pid // E, 0)
    rn = tl.where(is_route, pid % E, pid - n_route + E) + tl.arange(0, 1)  # [1]: this program's row
    nm = rn < E + H
    k_lo = tl.where(is_route, part * (K // M_SPLIT), 0)
    k_hi = tl.where(is_route, k_lo + K // M_SPLIT, K)
    gg = tl.arange(0, BG)
    rows = rn.to(tl.int64)
    nib_ptrs = nib_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None] * (K // 8) + (k_lo // 8 + gg)[None, :]
    low_ptrs = low_ptr.to(tl.pointer_type(tl.uint64)) + rows[:, None] * (K // 8) + (k_lo // 8 + gg)[None, :]
    x_ptrs = group_ptrs(a_ptr, (k_lo // 2 + 4 * gg)[None, :].to(tl.int64))
    wmask = nm[:, None] & (gg >= 0)[None, :]
    # no kernel writes the weight: the first two tiles, the row's window and escapes load before the PDL wait
    base4 = tl.load(base_ptr + rn, mask=nm, other=0).to(tl.uint32)[:, None] * 0x01010101
    nib = tl.load(nib_ptrs, mask=wmask, other=0)
    low = tl.load(low_ptrs, mask=wmask, other=0)
    more = wmask & (gg * 0 + k_lo + BLOCK_K < k_hi)[None, :]
    nib_next = tl.load(nib_ptrs + BG, mask=more, other=0)
    low_next = tl.load(low_ptrs + BG, mask=more, other=0)
    row = tl.sum(rn, axis=0)
    p_start = tl.load(eptr_ptr + row)
    p_end = tl.load(eptr_ptr + row + 1)
    erow, ecol, delta = _slice_escapes(
        erow_ptr, ecol_ptr, eval_ptr, base_ptr, p_start, p_end, k_lo, k_hi, ESCAPES
    )
    wait_for_previous(USE_PDL)
    # what is added to the product: the in-projection's W_r' h0 (M's slice 0) or h0's rows (a W_o program)
    r = tl.load(tl.where(is_route, part_ptr + rn, h_ptr + (rn - E)), mask=nm, other=0.0).to(tl.float32)
    r = tl.where(part == 0, r, 0.0)
    one = tl.arange(0, 1) < 1
    a_rows = a_ptr + tl.zeros((1, 1), dtype=tl.int64)
    esc = escape_sum(erow, ecol, delta, a_rows, a_rows, rn, one, 0, 1, False, False)  # [1, 1]
    acc = tl.zeros((1, 1, BG), dtype=tl.float32)
    ss = tl.zeros((1, BG), dtype=tl.float32)  # unused: no norm of a
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ahead = wmask & (gg * 0 + k0 + 2 * BLOCK_K < k_hi)[None, :]
        nib_ahead = tl.load(nib_ptrs + 2 * BG, mask=ahead, other=0)
        low_ahead = tl.load(low_ptrs + 2 * BG, mask=ahead, other=0)
        w = decode_group(nib, low.to(tl.uint32), (low >> 32).to(tl.uint32), base4, ASM)
        acc, ss = _packed_tile(acc, ss, w, x_ptrs, x_ptrs, one[:, None], one[:, None], False, False)
        nib, low, nib_next, low_next = nib_next, low_next, nib_ahead, low_ahead
        nib_ptrs += BG
        low_ptrs += BG
        x_ptrs = advance_groups(x_ptrs, BLOCK_K)
    # a row with more escapes than one load of them (rare)
    for p0 in range(p_start + ESCAPES, p_end, ESCAPES):
        erow, ecol, delta = _slice_escapes(
            erow_ptr, ecol_ptr, eval_ptr, base_ptr, p0, p_end, k_lo, k_hi, ESCAPES
        )
        esc += escape_sum(erow, ecol, delta, a_rows, a_rows, rn, one, 0, 1, False, False)
    y = tl.sum(tl.sum(acc, axis=2), axis=0) + tl.sum(esc, axis=0) + r  # [1] fp32
    _route_or_store(y, is_route, part, rn, nm, raw_ptr, counter_ptr, ids_ptr, top_ptr, h_ptr, n_route, E, EP, TOP_K, KP,
                    M_SPLIT)  # fmt: skip


def project_out_route_packed(
    a: torch.Tensor,
    packed: PackedBF16,
    residual: torch.Tensor,
    partial: torch.Tensor,
    top_k: int,
    cfg: dict,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``project_out_route_triton`` with [M; W_o] [E + H, Hv] packed. cfg: BLOCK_K (256 x num_warps keeps a
    group a thread), num_warps, M_SPLIT (1 when absent; (Hv / M_SPLIT) % BLOCK_K == 0), ESCAPES (default 16)."""
    H, E = residual.shape[1], partial.shape[1]
    K = a.shape[1]
    split = int(cfg.get("M_SPLIT", 1))
    bk = cfg["BLOCK_K"]
    require(
        a.shape[0] == 1
        and packed.shape == (E + H, K)
        and split >= 1
        and K % (split * bk) == 0
        and bk % 8 == 0,
        "project_out_route_packed: one token, [M; W_o] packed as [E + H, K], and K a multiple of M_SPLIT x BLOCK_K",
    )
    require(
        a.stride(1) == 1 and residual.is_contiguous() and partial.stride(1) == 1,
        "project_out_route_packed needs unit column strides and a contiguous residual",
    )
    require(
        a.dtype != torch.bfloat16 or a.data_ptr() % 8 == 0,
        "project_out_route_packed: bf16 a must be 8-byte aligned (it loads in 8-byte words)",
    )
    dev = a.device
    ids = torch.empty((1, top_k), dtype=torch.int32, device=dev)
    top = torch.empty((1, top_k), dtype=torch.float32, device=dev)
    raw = torch.empty((split, E), dtype=torch.float32, device=dev)
    _project_route_packed_kernel[(split * E + H,)](
        a, *packed.operands, residual, partial, raw, ticket_counters("routed projection", dev, 1), ids, top, H, K, E,
        BLOCK_K=bk, ESCAPES=int(cfg.get("ESCAPES", 16)), M_SPLIT=split, EP=triton.next_power_of_2(E), TOP_K=top_k,
        KP=triton.next_power_of_2(top_k), ASM=a.is_cuda, num_warps=cfg.get("num_warps", 4),
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}), **launch_options(a),
    )  # fmt: skip
    return ids, top
