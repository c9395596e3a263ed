"""The out-projection that also routes (one token): ``project_out_route_triton``.

Grid (M_SPLIT * E / BLOCK_N + H / BLOCK_N,) over the rows of [M; W_o] [E + H, Hv], M's first. A program of
W_o's rows streams them over the full K = Hv as the GEMV does (``linear/triton_kernel._gemv_tile``, the same
tiles, so h1's bits are the GEMV's), adds h0 in fp32 and writes h1 in place (one cast). A program of M's rows
streams one of M_SPLIT column slices of them, adds ``W_r' h0`` (the in-projection's last columns; slice 0
only) and writes its fp32 partial logits to ``raw [M_SPLIT, E]``, then takes a ticket among M's programs
(acq_rel after a CTA barrier: the last-block reduction of ``moe/router.py``). The last one sums the partials in
slice order (deterministic), takes the top-k (``moe/routing.subrow_softmax_topk`` of the raw logits: the order
of ``rstd * raw``, rstd > 0, so h1 is not needed), writes the ids and their raw logits and resets the counter
(CUDA-graph replays included). Why the split: the ~2300 programs are resident at once and share HBM evenly, so
a whole-row M program finishes with the W_o programs and the top-k tail (ticket, sum, 8 arg-max rounds) is
serial after the stream; an M program with 1 / M_SPLIT of the bytes finishes early and the tail hides under it.
The experts' gate_up applies the pre-norm and the softmax of the scaled logits itself
(``moe/triton_pairs``, NORM_X), so nothing serial follows the stream. W's first tile loads before the PDL wait.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.linear.triton_kernel import _gemv_tile
from hyserve.kernels.moe.routing import ROW_SPLIT, row_logits, subrow_softmax_topk
from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.tickets import ticket_counters


@triton.jit
def _route_or_store(y, is_route, part, rn, nm, raw_ptr, counter_ptr, ids_ptr, top_ptr, h_ptr, n_route, E,
                    EP: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr, M_SPLIT: tl.constexpr):  # fmt: skip
    """A program's end, whatever its weights' format: y [BLOCK_N] fp32 its rows' sums. M's rows: the partial
    logits stored, a ticket, and the last program's top-k; W_o's rows: h1 stored in place."""
    if is_route:
        tl.store(raw_ptr + part * E + rn, y, mask=nm)
        tl.debug_barrier()  # every store of this program before its release
        ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
        if ticket == n_route - 1:
            logits, cols = row_logits(raw_ptr, E, EP, ROW_SPLIT)
            for s in tl.static_range(1, M_SPLIT):  # slice order: the same sum every replay
                logits += row_logits(raw_ptr + s * E, E, EP, ROW_SPLIT)[0]
            if M_SPLIT > 1:  # the summed row, for the top-k's raw logits below (this CTA's own stores)
                tl.store(raw_ptr + cols, logits, mask=cols < E)
                tl.debug_barrier()
            ids, _ = subrow_softmax_topk(logits, cols, E, EP, TOP_K, KP, 0)
            kc = tl.arange(0, KP)
            top = tl.load(raw_ptr + ids, mask=kc < TOP_K, other=0.0, cache_modifier=".cg")
            tl.store(ids_ptr + kc, ids, mask=kc < TOP_K)
            tl.store(top_ptr + kc, top, mask=kc < TOP_K)
            tl.store(counter_ptr, 0)
    else:
        tl.store(h_ptr + (rn - E), y.to(h_ptr.dtype.element_ty), mask=nm)


@triton.jit
def _project_route_kernel(
    a_ptr,
    w_ptr,
    h_ptr,
    part_ptr,
    raw_ptr,
    counter_ptr,
    ids_ptr,
    top_ptr,
    H,
    K,
    E,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BCAST_X: tl.constexpr,
    REDUCE_EACH: tl.constexpr,
    M_SPLIT: tl.constexpr,
    EP: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    n_route = M_SPLIT * (E // BLOCK_N)  # programs of M's rows (slice-major); the rest take W_o's
    is_route = pid < n_route
    part = tl.where(is_route, pid // (E // BLOCK_N), 0)  # M's column slice (0 for W_o's programs)
    # this program's row block of [M; W_o]
    block = tl.where(is_route, pid % (E // BLOCK_N), pid - n_route + E // BLOCK_N)
    rn = block * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = rn < E + H
    if M_SPLIT == 1:
        k_lo = 0
        k_hi = K
    else:  # M's slice (its tiles masked past it when it is shorter than BLOCK_K); W_o's programs take the full
        # K. Multiples of 16 (the launcher checks): the hints keep W's loads as wide as the GEMV's
        k_lo = tl.multiple_of(part * (K // M_SPLIT), 16)
        k_hi = tl.multiple_of(tl.where(is_route, k_lo + K // M_SPLIT, K), 16)
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    w = tl.load(w_rows + (k_lo + kk)[None, :], mask=nm[:, None] & (k_lo + kk < k_hi)[None, :], other=0.0)
    wait_for_previous(USE_PDL)
    # what is added to the product: the in-projection's W_r' h0 (M's slice 0) or h0's rows (a W_o program)
    r = tl.load(tl.where(is_route, part_ptr + rn, h_ptr + (rn - E)), mask=nm, other=0.0).to(tl.float32)
    r = tl.where(part == 0, r, 0.0)
    mm = tl.arange(0, 1) < 1
    x_rows = a_ptr + tl.zeros((1, 1), dtype=tl.int64)
    if REDUCE_EACH:  # each tile summed over k as it comes (fewer registers than a tile-shaped accumulator)
        acc = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((1, BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((1, BLOCK_K), dtype=tl.float32)  # unused: no norm of a
    g0 = tl.zeros((BLOCK_K,), dtype=tl.float32)
    acc, ss = _gemv_tile(acc, ss, w, g0, x_rows, k_lo + kk, k_lo + kk < k_hi, mm, False, REDUCE_EACH, BCAST_X)
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        k = k0 + kk
        km = k < k_hi
        w = tl.load(w_rows + k[None, :], mask=nm[:, None] & km[None, :], other=0.0)
        acc, ss = _gemv_tile(acc, ss, w, g0, x_rows, k, km, mm, False, REDUCE_EACH, BCAST_X)
    if REDUCE_EACH:
        y = tl.sum(acc, axis=0) + r  # [BLOCK_N] fp32
    else:
        y = tl.sum(tl.sum(acc, axis=2), axis=0) + r
    _route_or_store(y, is_route, part, rn, nm, raw_ptr, counter_ptr, ids_ptr, top_ptr, h_ptr, n_route, E, EP, TOP_K, KP,
                    M_SPLIT)  # fmt: skip


def project_out_route_triton(
    a: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    partial: torch.Tensor,
    top_k: int,
    cfg: dict,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: a [1, Hv], weight [E + H, Hv] (M, then W_o; K contiguous), residual h0 [1, H] (contiguous,
    updated in place to h1), partial ``W_r' h0`` [1, E] (unit stride) -> (topk_ids [1, k] int32, their raw
    logits [1, k] fp32). cfg: the out-projection's GEMV plan (BLOCK_N dividing H and E, BLOCK_K, num_warps,
    BCAST_X, REDUCE_EACH, maxnreg; M_SPLIT, the column slices of M's rows, 1 when absent)."""
    H, E = residual.shape[1], partial.shape[1]
    K = a.shape[1]
    split = int(cfg.get("M_SPLIT", 1))
    if a.shape[0] != 1 or weight.shape != (E + H, K) or H % cfg["BLOCK_N"] or E % cfg["BLOCK_N"]:
        raise ValueError(
            f"project_out_route_triton takes one token and a [{E} + {H}, {K}] weight whose rows BLOCK_N "
            f"{cfg['BLOCK_N']} divides; got a {tuple(a.shape)}, weight {tuple(weight.shape)}"
        )
    if split < 1 or (split > 1 and K % (16 * split)):
        raise ValueError(f"M_SPLIT {split} must cut K = {K} into slices of a multiple of 16 columns")
    if a.stride(1) != 1 or weight.stride(1) != 1 or not residual.is_contiguous() or partial.stride(1) != 1:
        raise ValueError("project_out_route_triton needs unit column strides and a contiguous residual")
    dev = a.device
    ids = torch.empty((1, top_k), dtype=torch.int32, device=dev)
    top = torch.empty((1, top_k), dtype=torch.float32, device=dev)
    raw = torch.empty((split, E), dtype=torch.float32, device=dev)
    _project_route_kernel[((split * E + H) // cfg["BLOCK_N"],)](
        a, weight, residual, partial, raw, ticket_counters("routed projection", dev, 1), ids, top, H, K, E,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], BCAST_X=bool(cfg.get("BCAST_X", False)),
        REDUCE_EACH=bool(cfg.get("REDUCE_EACH", False)), M_SPLIT=split, EP=triton.next_power_of_2(E), TOP_K=top_k,
        KP=triton.next_power_of_2(top_k),
        num_warps=cfg.get("num_warps", 4), **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
        **launch_options(a),
    )  # fmt: skip
    return ids, top
