"""The screened greedy token in two launches (see ``reference.py`` for the bound).

``_screen_kernel``, grid (cdiv(V, BLOCK_V),): program p streams the int8 rows [p*BLOCK_V, (p+1)*BLOCK_V) of the
screen over K once for all N rows of x (half the LM head's bytes), writes each row's upper bounds
``upper [N, V]`` (fp32) and folds its largest lower bound into ``lower_max [N]`` with one atomic max (an
order-preserving int32 key). With ``DOT`` the [N, K] x [K, BLOCK_V] product runs on the tensor cores in x's
dtype (the int8 values are exact in bf16 / fp16, and the products exact in the fp32 accumulator); without, as
an fp32 multiply-add on the CUDA cores.

``_select_kernel``, grid (cdiv(V, BLOCK_R), N): program (p, r) reads the upper bounds of its BLOCK_R rows in
SUB-row pieces and, for a piece holding a row at or above row r's threshold, computes those rows' logits
exactly from the bf16 head (masked loads: only the candidate rows are read), rounds them to the weight's
dtype and keeps the best (value, row) key (``argmax/triton_kernel.py``'s key: the first of equal maxima
wins). One atomic max per program folds the keys; the program that draws row r's last ticket writes the
token and resets the row's lower_max, best key and counter for the next call.

Both kernels take ``USE_PDL``: the screen loads its first int8 tile, scales and radii before the wait (weights).
The state (lower_max, best, counter) is allocated outside graph capture and left reset by every launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.argmax.triton_kernel import _keys
from hyserve.kernels.greedy_head import MAX_ROWS
from hyserve.kernels.greedy_head.reference import NORM_MARGIN, SLACK, GreedyScreen
from hyserve.kernels.pdl import launch_options, wait_for_previous

# Globals a kernel reads must be constexpr.
INT32_MIN = tl.constexpr(-(2**31))
INT64_MIN = tl.constexpr(-(2**63))
NO_KEY = tl.constexpr(-(2**63) + 1)  # below every real key (argmax/triton_kernel.py), above the reset value
_NORM_MARGIN = tl.constexpr(NORM_MARGIN)
_SLACK = tl.constexpr(SLACK)

# (BLOCK_V, BLOCK_K, num_warps, DOT) of the screen per row count; (BLOCK_R, SUB, BLOCK_K, num_warps) of the select.
SCREEN_PLAN = {1: (64, 256, 4, False), MAX_ROWS: (64, 256, 4, True)}
SELECT_PLAN = (512, 16, 256, 4)


@triton.jit
def _ordered(v):
    """fp32 -> int32 whose signed order is v's order (negative values get their magnitude bits flipped)."""
    bits = v.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _unordered(key):
    """The inverse of ``_ordered`` (the same flip)."""
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


@triton.jit
def _in_k(k, K, EVEN_K: tl.constexpr):
    """k < K, known true for every tile when K is a multiple of the tile (so the loads stay vectorised)."""
    if EVEN_K:
        ok = tl.full(k.shape, 1, tl.int1)
    else:
        ok = k < K
    return ok


@triton.jit
def _screen_kernel(
    q_ptr,
    scale_ptr,
    radius_ptr,
    x_ptr,
    upper_ptr,
    lower_max_ptr,
    N,
    V,
    K,
    stride_w,
    stride_x,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    N_PAD: tl.constexpr,
    DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < V
    cols = tl.arange(0, BLOCK_K)
    n = tl.arange(0, N_PAD)
    n_ok = n < N
    w_rows = q_ptr + rows.to(tl.int64)[:, None] * stride_w
    # The screen, its scales and radii are weights: no kernel writes them, so they load before the wait.
    w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & _in_k(cols, K, EVEN_K)[None, :], other=0)
    scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    radius = tl.load(radius_ptr + rows, mask=row_ok, other=0.0)
    wait_for_previous(USE_PDL)  # x is the final norm's output
    x_rows = x_ptr + n.to(tl.int64)[:, None] * stride_x
    if DOT:
        acc = tl.zeros((N_PAD, BLOCK_V), dtype=tl.float32)
    else:  # reduced over K once, after the loop
        acc = tl.zeros((N_PAD, BLOCK_V, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((N_PAD,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + cols
        x = tl.load(x_rows + k[None, :], mask=n_ok[:, None] & _in_k(k, K, EVEN_K)[None, :], other=0.0)
        xf = x.to(tl.float32)
        ss += tl.sum(xf * xf, axis=1)
        if DOT:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision="ieee")
        else:
            acc += xf[:, None, :] * w.to(tl.float32)[None, :, :]
        k_next = k + BLOCK_K  # the next tile's loads go out before this tile's products
        if EVEN_K:
            next_ok = row_ok & (tl.full((BLOCK_V,), k0 + BLOCK_K, tl.int32) < K)  # one flag a tile
            w = tl.load(w_rows + k_next[None, :], mask=next_ok[:, None], other=0)
        else:
            w = tl.load(w_rows + k_next[None, :], mask=row_ok[:, None] & (k_next < K)[None, :], other=0)
    if not DOT:
        acc = tl.sum(acc, axis=2)
    x_norm = tl.sqrt(ss) * _NORM_MARGIN
    approx = acc * scale[None, :]
    bound = radius[None, :] * x_norm[:, None]
    out_ok = n_ok[:, None] & row_ok[None, :]
    tl.store(upper_ptr + n.to(tl.int64)[:, None] * V + rows[None, :], approx + bound, mask=out_ok)
    lower = tl.where(out_ok, approx - bound, float("-inf"))
    tl.atomic_max(lower_max_ptr + n, _ordered(tl.max(lower, axis=1)), mask=n_ok, sem="relaxed", scope="gpu")


@triton.jit
def _select_kernel(
    w_ptr,
    x_ptr,
    upper_ptr,
    lower_max_ptr,
    best_ptr,
    counter_ptr,
    ids_ptr,
    count_ptr,
    V,
    K,
    stride_w,
    stride_x,
    BLOCK_R: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    COUNT: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    r = tl.program_id(1)
    wait_for_previous(USE_PDL)  # upper and lower_max are the screen's output
    lower_max = _unordered(tl.load(lower_max_ptr + r))
    threshold = lower_max - _SLACK * tl.abs(lower_max)
    x_row = x_ptr + r.to(tl.int64) * stride_x
    upper_row = upper_ptr + r.to(tl.int64) * V
    cols = tl.arange(0, BLOCK_K)
    best = tl.full((), NO_KEY, tl.int64)
    for s in range(0, BLOCK_R, SUB):
        rows = pid * BLOCK_R + s + tl.arange(0, SUB)
        up = tl.load(upper_row + rows, mask=rows < V, other=float("-inf"))
        cand = up >= threshold
        num = tl.sum(cand.to(tl.int32), axis=0)
        if num > 0:
            acc = tl.zeros((SUB, BLOCK_K), dtype=tl.float32)
            w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w
            for k0 in range(0, K, BLOCK_K):
                k = k0 + cols
                w = tl.load(w_rows + k[None, :], mask=cand[:, None] & _in_k(k, K, EVEN_K)[None, :], other=0.0)
                xv = tl.load(x_row + k, mask=_in_k(k, K, EVEN_K), other=0.0)
                acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
            logit = tl.sum(acc, axis=1).to(w_ptr.dtype.element_ty).to(tl.float32)
            key = tl.where(cand, _keys(logit, rows), NO_KEY)
            best = tl.maximum(best, tl.max(key, axis=0))
            if COUNT:
                tl.atomic_add(count_ptr + r, num, sem="relaxed", scope="gpu")
    if best > NO_KEY:
        tl.atomic_max(best_ptr + r, best, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr + r, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        key = tl.atomic_xchg(best_ptr + r, INT64_MIN, sem="relaxed", scope="gpu")
        # No candidate at all only happens with non-finite hidden states (the bound is then NaN): token 0.
        token = tl.where(key > NO_KEY, 4294967295 - (key & 4294967295), 0)
        tl.store(ids_ptr + r, token)
        tl.atomic_xchg(lower_max_ptr + r, INT32_MIN, sem="relaxed", scope="gpu")
        tl.atomic_xchg(counter_ptr + r, 0, sem="relaxed", scope="gpu")


_STATE: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lower_max int32, best int64, counter int32), MAX_ROWS each, reset; allocated outside graph capture
    (``kernels/tickets.py`` says why)."""
    key = str(device)
    if key not in _STATE:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the greedy head's state must be allocated before CUDA-graph capture")
        _STATE[key] = (
            torch.full((MAX_ROWS,), INT32_MIN.value, dtype=torch.int32, device=device),
            torch.full((MAX_ROWS,), INT64_MIN.value, dtype=torch.int64, device=device),
            torch.zeros(MAX_ROWS, dtype=torch.int32, device=device),
        )
    return _STATE[key]


def screened_greedy_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    screen: GreedyScreen,
    screen_plan: tuple[int, int, int, bool] | None = None,
    select_plan: tuple[int, int, int, int] | None = None,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [N <= MAX_ROWS, K] (unit column stride), weight [V, K] contiguous -> greedy tokens [N] int64.
    ``count`` [N] int64, when given, accumulates how many rows were computed exactly (for measurements)."""
    n, k = x.shape
    v = weight.shape[0]
    ids = torch.empty(n, dtype=torch.int64, device=x.device)
    if n == 0:
        return ids
    if x.stride(1) != 1:
        x = x.contiguous()
    lower_max, best, counter = _state(x.device)
    upper = torch.empty((n, v), dtype=torch.float32, device=x.device)
    block_v, block_k, warps, dot = screen_plan or SCREEN_PLAN[1 if n == 1 else MAX_ROWS]
    _screen_kernel[(triton.cdiv(v, block_v),)](
        screen.q, screen.scale, screen.radius, x, upper, lower_max, n, v, k, k, x.stride(0),
        BLOCK_V=block_v, BLOCK_K=block_k, N_PAD=16 if dot else triton.next_power_of_2(n), DOT=dot,
        EVEN_K=k % block_k == 0,
        num_warps=warps, **launch_options(x),
    )  # fmt: skip
    block_r, sub, block_k2, warps2 = select_plan or SELECT_PLAN
    _select_kernel[(triton.cdiv(v, block_r), n)](
        weight, x, upper, lower_max, best, counter, ids, count if count is not None else ids, v, k, k, x.stride(0),
        BLOCK_R=block_r, SUB=sub, BLOCK_K=block_k2, EVEN_K=k % block_k2 == 0, COUNT=count is not None,
        num_warps=warps2,
        **launch_options(x),
    )  # fmt: skip
    return ids
