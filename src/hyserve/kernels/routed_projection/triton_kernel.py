"""The out-projection that also routes (one token): ``project_out_route_triton``.

Grid (H / BLOCK_N + E / BLOCK_N,) over the rows of [W_o; M] [H + E, Hv]: program p streams its BLOCK_N rows over
the full K = Hv as the GEMV does (``linear/triton_kernel._gemv_tile``, the same tiles, so h1's bits are the GEMV's).
A program of W_o's rows adds the residual h0 in fp32, writes h1 (one cast, in place) and the sum of squares of
its rows of bf16 h1 to ``ss [H / BLOCK_N]``; a program of M's rows adds ``W_r' h0`` (the in-projection's last
columns) and writes the raw logits fp32 to ``raw [E]``. Then every program takes a ticket (acq_rel, after a CTA
barrier: the last-block reduction of ``moe/router.py``), and the last one sums ``ss`` in a fixed order (the
result does not depend on which program finishes last), scales the logits by rstd, rounds them through the
model dtype (the router's F.linear does), takes the softmax top-k (``moe/routing.subrow_softmax_topk``, the
function the router's last program runs), and writes the ids, the weights and xn = rms_norm(h1) for the expert
kernels; it resets the counter for the next launch (CUDA-graph replays included).
W and the norm weight are no kernel's output: the first W tile loads before the PDL wait (kernels/pdl.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.linear.triton_kernel import _gemv_tile
from hyserve.kernels.moe.routing import ROW_SPLIT, round_code, row_logits, subrow_softmax_topk
from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.tickets import ticket_counters


@triton.jit
def _project_route_kernel(
    a_ptr,
    w_ptr,
    h_ptr,
    part_ptr,
    nw_ptr,
    ss_ptr,
    raw_ptr,
    counter_ptr,
    ids_ptr,
    wts_ptr,
    xn_ptr,
    eps,
    H,
    K,
    E,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BCAST_X: tl.constexpr,
    HP: tl.constexpr,
    SP: tl.constexpr,
    EP: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    ROUND: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    n_main = H // BLOCK_N  # programs of W_o's rows; the rest take M's
    is_route = pid >= n_main
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = rn < H + E
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    w = tl.load(w_rows + kk[None, :], mask=nm[:, None] & (kk < K)[None, :], other=0.0)
    wait_for_previous(USE_PDL)
    # what is added to the product: h0's rows (a W_o program) or the in-projection's W_r' h0 (an M program)
    r_ptrs = tl.where(is_route, part_ptr + (rn - H), h_ptr + rn)
    r = tl.load(r_ptrs, mask=nm, other=0.0).to(tl.float32)
    mm = tl.arange(0, 1) < 1
    x_rows = a_ptr + tl.zeros((1, 1), dtype=tl.int64)
    acc = tl.zeros((1, BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((1, BLOCK_K), dtype=tl.float32)  # unused: no norm of a
    g0 = tl.zeros((BLOCK_K,), dtype=tl.float32)  # no norm weight either
    acc, ss = _gemv_tile(acc, ss, w, g0, x_rows, kk, kk < K, mm, False, False, BCAST_X)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + kk
        km = k < K
        w = tl.load(w_rows + k[None, :], mask=nm[:, None] & km[None, :], other=0.0)
        acc, ss = _gemv_tile(acc, ss, w, g0, x_rows, k, km, mm, False, False, BCAST_X)
    y = tl.sum(tl.sum(acc, axis=2), axis=0) + r  # [BLOCK_N] fp32
    if is_route:
        tl.store(raw_ptr + (rn - H), y, mask=nm)
    else:
        yb = y.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + rn, yb, mask=nm)
        yf = yb.to(tl.float32)
        tl.store(ss_ptr + pid, tl.sum(yf * yf, axis=0))
    tl.debug_barrier()  # every store of this program before its release
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        sp = tl.arange(0, SP)
        part_ss = tl.load(ss_ptr + sp, mask=sp < n_main, other=0.0, cache_modifier=".cg")
        rstd = 1.0 / tl.sqrt(tl.sum(part_ss, axis=0) / H + eps)
        logits, cols = row_logits(raw_ptr, E, EP, ROW_SPLIT)
        logits = (logits * rstd).to(h_ptr.dtype.element_ty).to(tl.float32)  # -inf stays -inf past E
        ids, wts = subrow_softmax_topk(logits, cols, E, EP, TOP_K, KP, ROUND)
        kc = tl.arange(0, KP)
        tl.store(ids_ptr + kc, ids, mask=kc < TOP_K)
        tl.store(wts_ptr + kc, wts, mask=kc < TOP_K)
        hh = tl.arange(0, HP)
        h1 = tl.load(h_ptr + hh, mask=hh < H, other=0.0, cache_modifier=".cg").to(tl.float32)
        nw = tl.load(nw_ptr + hh, mask=hh < H, other=0.0).to(tl.float32)
        tl.store(xn_ptr + hh, (h1 * rstd * (1.0 + nw)).to(xn_ptr.dtype.element_ty), mask=hh < H)
        tl.store(counter_ptr, 0)


def project_out_route_triton(
    a: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    partial: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    top_k: int,
    cfg: dict,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token: a [1, Hv], weight [H + E, Hv] (W_o, then M; K contiguous), residual h0 [1, H] (contiguous,
    updated in place to h1), partial ``W_r' h0`` [1, E] (unit stride), norm_weight [H] -> (topk_ids [1, k] int32,
    topk_weights [1, k] fp32, xn [1, H]). cfg: the out-projection's GEMV plan (BLOCK_N dividing H and E,
    BLOCK_K, num_warps, BCAST_X)."""
    H, E = residual.shape[1], partial.shape[1]
    K = a.shape[1]
    if a.shape[0] != 1 or weight.shape != (H + E, K) or H % cfg["BLOCK_N"] or E % cfg["BLOCK_N"]:
        raise ValueError(
            f"project_out_route_triton takes one token and a [{H} + {E}, {K}] weight whose rows BLOCK_N "
            f"{cfg['BLOCK_N']} divides; got a {tuple(a.shape)}, weight {tuple(weight.shape)}"
        )
    if a.stride(1) != 1 or weight.stride(1) != 1 or not residual.is_contiguous() or partial.stride(1) != 1:
        raise ValueError("project_out_route_triton needs unit column strides and a contiguous residual")
    dev = a.device
    n_main = H // cfg["BLOCK_N"]
    ids = torch.empty((1, top_k), dtype=torch.int32, device=dev)
    wts = torch.empty((1, top_k), dtype=torch.float32, device=dev)
    xn = torch.empty((1, H), dtype=a.dtype, device=dev)
    ss = torch.empty((n_main,), dtype=torch.float32, device=dev)
    raw = torch.empty((triton.next_power_of_2(E),), dtype=torch.float32, device=dev)
    _project_route_kernel[(n_main + E // cfg["BLOCK_N"],)](
        a, weight, residual, partial, norm_weight, ss, raw, ticket_counters("routed projection", dev, 1),
        ids, wts, xn, norm_eps, H, K, E,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], BCAST_X=bool(cfg.get("BCAST_X", False)),
        HP=triton.next_power_of_2(H), SP=triton.next_power_of_2(n_main), EP=triton.next_power_of_2(E),
        TOP_K=top_k, KP=triton.next_power_of_2(top_k), ROUND=round_code(a.dtype),
        num_warps=cfg.get("num_warps", 4), **launch_options(a),
    )  # fmt: skip
    return ids, wts, xn
