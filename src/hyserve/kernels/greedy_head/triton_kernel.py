"""The screened greedy token in three launches (see ``reference.py`` for the bound).

``_limbs_kernel``, grid (N,): splits each row of x into its two int8 limbs, packed four to an int32
(``p [2, N, K/4]``), and writes s1, s2, ||x|| and ||e|| (``stats [N, 4]``).

``_screen_kernel``, grid (cdiv(V, BLOCK_V),): program p streams the int8 rows [p*BLOCK_V, (p+1)*BLOCK_V) of the
screen (read as int32, four weights each) over K once for all N rows of x (half the LM head's bytes), with
two ``dp4a`` a word (one a limb; exact int32 sums, no conversion of the weights), writes each row's upper
bounds ``upper [N, V]`` (fp32) and folds its largest lower bound into ``lower_max [N]`` with one atomic max
(an order-preserving int32 key). ``USE_ASM`` off (the interpreter) computes ``dp4a`` with shifts.

``_select_kernel``, grid (cdiv(V, BLOCK_R), N): program (p, r) reads the upper bounds of its BLOCK_R rows at
once; the rows at or above row r's threshold (usually none, else one or two) are compacted into a scratch
list, and their logits computed exactly from the bf16 head MAXC rows at a time, rounded to the weight's
dtype; it keeps the best (value, row) key (``argmax/triton_kernel.py``'s key: the first of equal maxima
wins). One atomic max per program folds the keys; the program that draws row r's last ticket writes the
token and resets the row's lower_max, best key and counter for the next call.

All take ``USE_PDL``; the screen loads its first int8 tile, scales and bound terms before the wait (weights).
The state (lower_max, best, counter) is allocated outside graph capture and left reset by every launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels import tma
from hyserve.kernels.argmax.triton_kernel import _keys, _ordered, _unordered
from hyserve.kernels.greedy_head import MAX_ROWS
from hyserve.kernels.greedy_head.reference import NORM_MARGIN, SLACK, GreedyScreen
from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.tickets import kernel_state, ticket_counters

# Globals a kernel reads must be constexpr.
INT32_MIN = tl.constexpr(-(2**31))
INT64_MIN = tl.constexpr(-(2**63))
NO_KEY = tl.constexpr(-(2**63) + 1)  # below every real key (argmax/triton_kernel.py), above the reset value
_NORM_MARGIN = tl.constexpr(NORM_MARGIN)
_SLACK = tl.constexpr(SLACK)

# (BLOCK_V, BLOCK_K in int8 weights, num_warps, TMA stages or 0) of the screen by the largest row count it takes,
# the best of `greedy_head.bench --sweep` on the H200 (2026-12-03, docs/performance.md): 128.3 / 130.6 / 159.3 us
# at 1 / 2 / 4 rows; 4 rows re-tuned on the graph-replayed decode step (2026-12-04, scripts/tune_step.py --batch 4):
# (32, 128, 4, 4) against (128, 64, 4, 4) in a step 7 us shorter; (BLOCK_R, MAXC, BLOCK_K, num_warps) of the select.
SCREEN_PLAN = {1: (64, 128, 4, 4), 2: (64, 128, 4, 4), MAX_ROWS: (32, 128, 4, 4)}
SELECT_PLAN = (512, 8, 1024, 4)


@triton.jit
def _in_k(k, K, EVEN_K: tl.constexpr):
    """k < K, known true for every tile when K is a multiple of the tile (so the loads stay vectorised)."""
    if EVEN_K:
        ok = tl.full(k.shape, 1, tl.int1)
    else:
        ok = k < K
    return ok


@triton.jit
def _dp4a(a, b, c, USE_ASM: tl.constexpr):
    """c + the dot product of the four signed bytes of a and of b (int32 tensors of one shape)."""
    if USE_ASM:
        d = tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1
        )
    else:
        d = c
        for j in tl.static_range(4):
            d += ((a << (24 - 8 * j)) >> 24) * ((b << (24 - 8 * j)) >> 24)
    return d


@triton.jit
def _limb(v, inv_s):
    """round(v / s) in [-127, 127] (floor(v / s + 0.5), as ``reference.split_limbs``)."""
    return tl.minimum(tl.maximum(tl.floor(v * inv_s + 0.5), -127.0), 127.0)


@triton.jit
def _limbs_kernel(x_ptr, p_ptr, stats_ptr, N, K4, stride_x, BLOCK_K4: tl.constexpr, USE_PDL: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK_K4)
    ok = c < K4
    x_row = x_ptr + r.to(tl.int64) * stride_x + 4 * c
    wait_for_previous(USE_PDL)  # x is the final norm's output
    x0 = tl.load(x_row, mask=ok, other=0.0).to(tl.float32)
    x1 = tl.load(x_row + 1, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + 2, mask=ok, other=0.0).to(tl.float32)
    x3 = tl.load(x_row + 3, mask=ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.maximum(tl.maximum(tl.abs(x0), tl.abs(x1)), tl.maximum(tl.abs(x2), tl.abs(x3))), axis=0)
    s1 = tl.maximum(amax / 127.0, 1e-30)  # 1 / s2 stays finite for a zero row
    s2 = s1 / 127.0
    inv1 = 1.0 / s1
    inv2 = 1.0 / s2
    p1 = tl.zeros((BLOCK_K4,), dtype=tl.int32)
    p2 = tl.zeros((BLOCK_K4,), dtype=tl.int32)
    ss = tl.zeros((BLOCK_K4,), dtype=tl.float32)
    es = tl.zeros((BLOCK_K4,), dtype=tl.float32)
    for j in tl.static_range(4):
        if j == 0:
            xv = x0
        elif j == 1:
            xv = x1
        elif j == 2:
            xv = x2
        else:
            xv = x3
        l1 = _limb(xv, inv1)
        r1 = xv - s1 * l1
        l2 = _limb(r1, inv2)
        e = r1 - s2 * l2
        ss += xv * xv
        es += e * e
        p1 = p1 | ((l1.to(tl.int32) & 255) << (8 * j))
        p2 = p2 | ((l2.to(tl.int32) & 255) << (8 * j))
    out = p_ptr + r.to(tl.int64) * K4 + c
    tl.store(out, p1, mask=ok)
    tl.store(out + N * K4, p2, mask=ok)
    stats = stats_ptr + 4 * r
    tl.store(stats, s1)
    tl.store(stats + 1, s2)
    tl.store(stats + 2, tl.sqrt(tl.sum(ss, axis=0)))
    tl.store(stats + 3, tl.sqrt(tl.sum(es, axis=0)))


@triton.jit
def _screen_tile(acc1, acc2, w, p_rows, k, n_ok, N, K4, EVEN_K: tl.constexpr, USE_ASM: tl.constexpr):
    """acc1 / acc2 [N_PAD, BLOCK_V, BLOCK_K4] += dp4a of the weight words w [BLOCK_V, BLOCK_K4] with the
    limbs' words at k."""
    p_ok = n_ok[:, None] & _in_k(k, K4, EVEN_K)[None, :]
    p1 = tl.load(p_rows + k[None, :], mask=p_ok, other=0)
    p2 = tl.load(p_rows + N * K4 + k[None, :], mask=p_ok, other=0)
    w3 = tl.broadcast_to(w[None, :, :], acc1.shape)
    acc1 = _dp4a(w3, tl.broadcast_to(p1[:, None, :], acc1.shape), acc1, USE_ASM)
    acc2 = _dp4a(w3, tl.broadcast_to(p2[:, None, :], acc2.shape), acc2, USE_ASM)
    return acc1, acc2


@triton.jit
def _screen_kernel(
    q_ptr,
    q_desc,
    scale_ptr,
    radius_ptr,
    wnorm_ptr,
    p_ptr,
    stats_ptr,
    upper_ptr,
    lower_max_ptr,
    N,
    V,
    K4,
    stride_w4,
    BLOCK_V: tl.constexpr,
    BLOCK_K4: tl.constexpr,
    N_PAD: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_ASM: tl.constexpr,
    TMA: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """q_desc: the screen's [V, K/4] int32 descriptor with [BLOCK_V, BLOCK_K4] boxes when TMA > 0 (a stage
    count: the K loop pipelined that deep), else unused."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < V
    cols = tl.arange(0, BLOCK_K4)
    n = tl.arange(0, N_PAD)
    n_ok = n < N
    w_rows = q_ptr + rows.to(tl.int64)[:, None] * stride_w4
    # The screen, its scales and bound terms are weights: no kernel writes them, so they load before the wait.
    if TMA:
        w = q_desc.load([pid * BLOCK_V, 0])
    else:
        w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & _in_k(cols, K4, EVEN_K)[None, :], other=0)
    scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)
    radius = tl.load(radius_ptr + rows, mask=row_ok, other=0.0)
    wnorm = tl.load(wnorm_ptr + rows, mask=row_ok, other=0.0)
    wait_for_previous(USE_PDL)  # the limbs and stats are the previous kernel's output
    p_rows = p_ptr + n.to(tl.int64)[:, None] * K4  # [N_PAD, 1]
    acc1 = tl.zeros((N_PAD, BLOCK_V, BLOCK_K4), dtype=tl.int32)
    acc2 = tl.zeros((N_PAD, BLOCK_V, BLOCK_K4), dtype=tl.int32)
    if TMA:  # pipelined: the copies of the next TMA-1 tiles are in flight during this one's products
        acc1, acc2 = _screen_tile(acc1, acc2, w, p_rows, cols, n_ok, N, K4, EVEN_K, USE_ASM)
        for k0 in tl.range(BLOCK_K4, K4, BLOCK_K4, num_stages=TMA):
            w = q_desc.load([pid * BLOCK_V, k0])
            acc1, acc2 = _screen_tile(acc1, acc2, w, p_rows, k0 + cols, n_ok, N, K4, EVEN_K, USE_ASM)
    else:
        for k0 in range(0, K4, BLOCK_K4):
            k = k0 + cols
            acc1, acc2 = _screen_tile(acc1, acc2, w, p_rows, k, n_ok, N, K4, EVEN_K, USE_ASM)
            k_next = k + BLOCK_K4  # the next tile's loads go out before this tile's products retire
            if EVEN_K:
                next_ok = row_ok & (tl.full((BLOCK_V,), k0 + BLOCK_K4, tl.int32) < K4)  # one flag a tile
                w = tl.load(w_rows + k_next[None, :], mask=next_ok[:, None], other=0)
            else:
                w = tl.load(w_rows + k_next[None, :], mask=row_ok[:, None] & (k_next < K4)[None, :], other=0)
    stats = stats_ptr + 4 * n
    s1 = tl.load(stats, mask=n_ok, other=0.0)
    s2 = tl.load(stats + 1, mask=n_ok, other=0.0)
    x_norm = tl.load(stats + 2, mask=n_ok, other=0.0) * _NORM_MARGIN
    e_norm = tl.load(stats + 3, mask=n_ok, other=0.0) * _NORM_MARGIN
    d1 = tl.sum(acc1, axis=2).to(tl.float32)  # [N_PAD, BLOCK_V], exact below 2^24
    d2 = tl.sum(acc2, axis=2).to(tl.float32)
    approx = (s1[:, None] * d1 + s2[:, None] * d2) * scale[None, :]
    bound = radius[None, :] * x_norm[:, None] + wnorm[None, :] * e_norm[:, None]
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
    scratch_ptr,
    V,
    K,
    stride_w,
    stride_x,
    BLOCK_R: tl.constexpr,
    MAXC: tl.constexpr,
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
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    up = tl.load(upper_ptr + r.to(tl.int64) * V + rows, mask=rows < V, other=float("-inf"))
    cand = up >= threshold
    num = tl.sum(cand.to(tl.int32), axis=0)
    best = tl.full((), NO_KEY, tl.int64)
    if num > 0:  # most programs have no candidate and stop here
        # The candidates' row ids, compacted into this program's scratch, then computed MAXC at a time with
        # the whole K in flight (a handful of rows: latency, not bytes, is the cost here).
        scratch = scratch_ptr + (r * tl.num_programs(0) + pid).to(tl.int64) * BLOCK_R
        tl.store(scratch + tl.cumsum(cand.to(tl.int32), axis=0) - 1, rows, mask=cand)
        tl.debug_barrier()  # the CTA's stores are visible to all its threads past the barrier
        x_row = x_ptr + r.to(tl.int64) * stride_x
        for c0 in range(0, num, MAXC):
            c = c0 + tl.arange(0, MAXC)
            c_ok = c < num
            crow = tl.load(scratch + c, mask=c_ok, other=0)
            w_rows = w_ptr + crow.to(tl.int64)[:, None] * stride_w
            logit = tl.zeros((MAXC,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                k_ok = _in_k(k, K, EVEN_K)
                w = tl.load(w_rows + k[None, :], mask=c_ok[:, None] & k_ok[None, :], other=0.0)
                xv = tl.load(x_row + k, mask=k_ok, other=0.0)
                logit += tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)
            logit = logit.to(w_ptr.dtype.element_ty).to(tl.float32)
            best = tl.maximum(best, tl.max(tl.where(c_ok, _keys(logit, crow), NO_KEY), axis=0))
        if COUNT:
            tl.atomic_add(count_ptr + r, num, sem="relaxed", scope="gpu")
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


def _state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lower_max int32, best int64, counter int32), MAX_ROWS each, reset (``kernels/tickets.py``)."""
    return (
        kernel_state("greedy head lower_max", device, MAX_ROWS, fill=INT32_MIN.value),
        kernel_state("greedy head best", device, MAX_ROWS, dtype=torch.int64, fill=INT64_MIN.value),
        ticket_counters("greedy head", device, MAX_ROWS),
    )


def screened_greedy_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    screen: GreedyScreen,
    screen_plan: tuple[int, int, int, int] | None = None,
    select_plan: tuple[int, int, int, int] | None = None,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [N <= MAX_ROWS, K] (K a multiple of 4), weight [V, K] contiguous -> greedy tokens [N] int64.
    ``count`` [N] int64, when given, accumulates how many rows were computed exactly (for measurements)."""
    n, k = x.shape
    v = weight.shape[0]
    ids = torch.empty(n, dtype=torch.int64, device=x.device)
    if n == 0:
        return ids
    if x.stride(1) != 1:
        x = x.contiguous()
    k4 = k // 4
    lower_max, best, counter = _state(x.device)
    limbs = torch.empty((2, n, k4), dtype=torch.int32, device=x.device)
    stats = torch.empty((n, 4), dtype=torch.float32, device=x.device)
    upper = torch.empty((n, v), dtype=torch.float32, device=x.device)
    _limbs_kernel[(n,)](x, limbs, stats, n, k4, x.stride(0), BLOCK_K4=triton.next_power_of_2(k4), num_warps=4,
                        **launch_options(x))  # fmt: skip
    block_v, block_k, warps, stages = screen_plan or SCREEN_PLAN[min(p for p in SCREEN_PLAN if p >= n)]
    words = screen.q.view(torch.int32)  # [V, K/4]: four int8 weights a word
    desc = tma.descriptor(words, [block_v, block_k // 4]) if stages else None
    _screen_kernel[(triton.cdiv(v, block_v),)](
        words, desc if desc is not None else words, screen.scale, screen.radius, screen.wnorm, limbs, stats, upper,
        lower_max, n, v, k4, k4, BLOCK_V=block_v, BLOCK_K4=block_k // 4, N_PAD=triton.next_power_of_2(n),
        EVEN_K=k4 % (block_k // 4) == 0, USE_ASM=x.is_cuda, TMA=stages if desc is not None else 0, num_warps=warps,
        **launch_options(x),
    )  # fmt: skip
    block_r, maxc, block_k2, warps2 = select_plan or SELECT_PLAN
    programs = triton.cdiv(v, block_r)
    scratch = torch.empty((n, programs * block_r), dtype=torch.int32, device=x.device)
    _select_kernel[(programs, n)](
        weight, x, upper, lower_max, best, counter, ids, count if count is not None else ids, scratch, v, k, k,
        x.stride(0), BLOCK_R=block_r, MAXC=maxc, BLOCK_K=block_k2, EVEN_K=k % block_k2 == 0,
        COUNT=count is not None, num_warps=warps2, **launch_options(x),
    )  # fmt: skip
    return ids
