"""MoE routing and expert grouping in Triton: fp32 softmax over all E, top-k, renormalise, then the
(token, slot) pairs sorted by expert and cut into blocks of at most BLOCK_M rows for the expert GEMMs.

Inputs: router logits [T, E] (``x @ gate_weight.T``, computed by cuBLAS: a GEMV/GEMM that spreads over
all SMs; at T <= 64 ``router.py`` fuses the router GEMV with this routing in one launch). Outputs (all int32
unless noted, no host reads, CUDA-graph safe; grids depend on T only):

- ``topk_ids [T, k]``, ``topk_weights [T, k]`` fp32 (rounded through x's dtype, as HF does
  ``w.to(logits.dtype)``); slots in descending probability order, like ``torch.topk``.
- ``sorted_pairs [N]`` (N = T*k): pair ids ``t*k + j`` sorted by expert, then by pair id (stable).
  "Row" r in [0, N) of the expert GEMMs is the pair ``sorted_pairs[r]``; rows N..N+T-1 are the shared
  expert's (row N + t is token t).
- ``meta [3*MAXB + 1]``: block b (b < meta[3*MAXB] = number of blocks) covers rows
  ``[meta[MAXB+b], meta[MAXB+b] + meta[2*MAXB+b])`` (at most BLOCK_M rows, never padded) of expert
  ``meta[b]``; expert id E means the shared expert. The ``cdiv(T, BLOCK_M)`` shared blocks come first, then
  the routed blocks by expert id. MAXB (``max_blocks``) is a host bound that depends on T only.

Four implementations of the grouping, same outputs (the fourth up to the pairs' order within an expert):

- small T (``TP*KP <= SMALL_PAIRS``), fewer than ``SPLIT_MIN_TOKENS`` tokens: one program
  (``_route_small_kernel``) does everything: softmax and top-k on a [TP, EP] tile; the row of pair i is
  the rank of its unique key ``expert*N + i`` (a [chunk, NP] comparison summed per row: a counting sort
  without ``tl.sort``); ``tl.histogram`` for the per-expert counts, block list from cumsums. One launch.
- small T from ``SPLIT_MIN_TOKENS`` on ("split"): ``_topk_kernel`` (grid over tokens, SPLIT_BLOCK_T each) then
  ``_group_kernel`` (the same counting sort from the stored ids, GROUP_CHUNK pairs per program, and one
  more program for the block list). Two launches, but neither the top-k nor the ranking runs row after
  row in one program (at T = 32 the single program took ~25 us on the H200; top-k over tokens + one
  grouping program 4 + 10 us).
- large T: ``_route_kernel`` (grid cdiv(T, BT): top-k + per-token-block histogram [NTB, EP]),
  ``_align_scan_kernel`` (grid over chunks of token blocks: per-expert totals, each token block's base
  offset per expert; program 0 the block list) and ``_align_scatter_kernel`` (grid NTB: each pair lands
  at base[tb, expert] + its rank in the token block's expert-sorted order). Deterministic; no atomics anywhere.
- large T, ``atomic`` (the plan's ``"atomic_routing"``: the H200 plans from 512 tokens): ``_route_rank_kernel``
  (grid cdiv(T, BT): top-k, and each pair's rank among its expert's pairs from an atomic add on that expert's
  counter) then
  ``_place_kernel`` (grid over chunks of pairs: the experts' first rows from the E counters, each pair at its
  expert's first row + its rank; program 0 the block list; the program that draws the last ticket zeroes the
  counters). Two launches, no pass over per-token-block counts. The ids, weights and block list are the
  others'; within an expert's rows the pairs come in the order their atomics ran, so ``sorted_pairs`` is
  not reproducible, but every expert kernel computes a row from that row's pair alone, so the MoE output is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require
from hyserve.kernels.moe.workspace import empty, launch
from hyserve.kernels.pdl import wait_for_previous
from hyserve.kernels.tickets import ticket_counters

SMALL_PAIRS = 512  # largest TP*KP the single-program path takes (T <= 64 at k = 8)
# From this many tokens the small path splits top-k (grid over tokens, SPLIT_BLOCK_T per program) from the
# grouping (_group_kernel): a single program's top-k over [TP, E] serialises TP rows of 8 arg-max passes
SPLIT_MIN_TOKENS = 16
SPLIT_BLOCK_T = 4  # the fastest of 1/2/4/8 at T = 16..64 (``bench --routing``, H200, 2026-12-03)
GROUP_CHUNK = 64  # pairs each ranking program of the split path places
# Tokens per top-k program of the large path (at most; ``_route_large``), by T: (largest T, tokens). Small
# blocks put more programs on the top-k's k rounds, but the scan sums all the blocks' counts in every program.
# Graph-replayed routing at 128 / 256 / 512 / 1024 / 2048 / 4096 tokens with 4 tokens a program: 12.7 / 13.1 /
# 15.4 / 19.9 / 30.4 / 52.7 us; with 16: 19.6 / 20.5 / 20.8 / 21.5 / 27.8 / 40.1 (``bench --routing``, H200).
LARGE_BLOCK_T = ((1024, 4), (1 << 30, 16))
RANK_CHUNK = tl.constexpr(128)  # rows of the [RANK_CHUNK, P] key comparison done at once
_BIG = tl.constexpr(2**31 - 1)


@triton.jit
def _topk_key(p, cols, E, EP: tl.constexpr):
    """The packed int64 key ``bits(p) << 32 | (EP - 1 - col)`` of probabilities p (any shape, ``cols`` their
    columns); -1 in the columns >= E (see ``_softmax_topk``)."""
    low = cols.to(tl.int64) * -1 + (
        EP - 1
    )  # tensor first: the interpreter keeps constexpr - tensor a constexpr
    return tl.where(cols < E, (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | low, -1)


@triton.jit
def _key_column(best, EP: tl.constexpr):
    """(column int32, probability fp32) of packed keys ``best``."""
    return ((best & 0xFFFFFFFF) * -1 + (EP - 1)).to(tl.int32), (best >> 32).to(tl.int32).to(
        tl.float32, bitcast=True
    )


@triton.jit
def _normalise_weights(w, axis: tl.constexpr, ROUND: tl.constexpr):
    """w / its sum over ``axis``, then rounded: ROUND 0 keep fp32, 1 through bf16, 2 through fp16."""
    w = w / tl.expand_dims(tl.sum(w, axis=axis), axis)
    if ROUND == 1:
        w = w.to(tl.bfloat16).to(tl.float32)
    elif ROUND == 2:
        w = w.to(tl.float16).to(tl.float32)
    return w


@triton.jit
def _softmax_topk(logits, cols, E, K: tl.constexpr, KP: tl.constexpr, ROUND: tl.constexpr):
    """logits [R, EP] fp32 (-inf in columns >= E) -> (ids [R, KP] int32, weights [R, KP] fp32).

    Columns >= K of the outputs are 0. ROUND: 0 keep fp32, 1 round the weights through bf16, 2 fp16.
    Each of the k rounds is one max-reduction over packed int64 keys ``bits(p) << 32 | (EP - 1 - col)``: a
    probability p >= 0 orders like its fp32 bit pattern, and among equal p the lowest column wins (what
    ``argmax(tie_break_left=True)`` picks), so the key carries both the value and its column (a max and an
    argmax were two reductions a round). Taken and padding columns hold the key -1."""
    EP: tl.constexpr = logits.shape[1]
    m = tl.max(logits, axis=1)
    p = tl.exp(logits - m[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    key = _topk_key(p, cols[None, :], E, EP)
    kc = tl.arange(0, KP)
    ids = tl.zeros((logits.shape[0], KP), dtype=tl.int32)
    w = tl.zeros((logits.shape[0], KP), dtype=tl.float32)
    for j in tl.static_range(K):
        idx, val = _key_column(tl.max(key, axis=1), EP)
        ids = tl.where(kc[None, :] == j, idx[:, None], ids)
        w = tl.where(kc[None, :] == j, val[:, None], w)
        key = tl.where(cols[None, :] == idx[:, None], -1, key)
    return ids, _normalise_weights(w, 1, ROUND)


@triton.jit
def _load_logits(logits_ptr, stride_lt, rows, rmask, cols, E):
    """The [R, EP] router logits of ``rows`` in fp32, -inf in the columns >= E."""
    logits = tl.load(
        logits_ptr + rows[:, None].to(tl.int64) * stride_lt + cols[None, :],
        mask=rmask[:, None] & (cols[None, :] < E),
        other=0.0,
    ).to(tl.float32)
    return tl.where(cols[None, :] < E, logits, float("-inf"))


@triton.jit
def _row_softmax_topk(
    row_ptr, E, EP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, ROUND: tl.constexpr, SPLIT: tl.constexpr
):
    """``_softmax_topk`` of one row of fp32 logits at ``row_ptr`` (EP columns, those >= E ignored) -> (ids [KP]
    int32, weights [KP] fp32), for a program that routes a single token.

    The row is loaded as [SPLIT, EP // SPLIT], which puts whole sub-rows in a warp (SPLIT = the 4 warps of the
    callers), so each of the k arg-max rounds over a sub-row stays inside its warp; the SPLIT * KP <= 32
    candidates then fit one warp (replicated in each), whose k rounds need no CTA barrier either. On a [1, EP]
    tile every round was a cross-warp reduction: the T = 1 router's ticket tail took 52 CTA barriers in its
    sm_90 build, 10 now. Same keys, so the same order and tie-break as ``_softmax_topk``; m and the softmax
    sum reduce in another order (the weights may differ from its in the last fp32 bit)."""
    logits, cols = row_logits(row_ptr, E, EP, SPLIT)
    return subrow_softmax_topk(logits, cols, E, EP, K, KP, ROUND)


@triton.jit
def row_logits(row_ptr, E, EP: tl.constexpr, SPLIT: tl.constexpr):
    """One row of fp32 logits at ``row_ptr`` as [SPLIT, EP // SPLIT] sub-rows (-inf in the columns >= E) and
    their columns, the layout ``subrow_softmax_topk`` takes (``_row_softmax_topk``)."""
    S: tl.constexpr = min(SPLIT, EP)
    C: tl.constexpr = EP // S
    cols = tl.arange(0, S)[:, None] * C + tl.arange(0, C)[None, :]
    logits = tl.load(row_ptr + cols, mask=cols < E, other=0.0, cache_modifier=".cg").to(tl.float32)
    return tl.where(cols < E, logits, float("-inf")), cols


@triton.jit
def subrow_softmax_topk(
    logits, cols, E, EP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, ROUND: tl.constexpr
):
    """``_row_softmax_topk`` of a row already loaded by ``row_logits`` (logits [S, C] fp32, their cols)."""
    S: tl.constexpr = logits.shape[0]
    m = tl.max(tl.max(logits, axis=1), axis=0)
    p = tl.exp(logits - m)
    p = p / tl.sum(tl.sum(p, axis=1), axis=0)
    key = _topk_key(p, cols, E, EP)
    kc = tl.arange(0, KP)
    cand = tl.full((S, KP), -1, tl.int64)
    for j in tl.static_range(K):  # each sub-row's top k (keys are unique: the column is in the low bits)
        best = tl.max(key, axis=1)
        cand = tl.where(kc[None, :] == j, best[:, None], cand)
        key = tl.where(key == best[:, None], -1, key)
    cand = tl.reshape(cand, (S * KP,), can_reorder=REORDER)
    ids = tl.zeros((KP,), dtype=tl.int32)
    w = tl.zeros((KP,), dtype=tl.float32)
    for j in tl.static_range(K):
        best = tl.max(cand, axis=0)
        idx, val = _key_column(best, EP)
        ids = tl.where(kc == j, idx, ids)
        w = tl.where(kc == j, val, w)
        cand = tl.where(cand == best, -1, cand)
    return ids, _normalise_weights(w, 0, ROUND)


ROW_SPLIT = tl.constexpr(4)  # sub-rows of ``_row_softmax_topk``: the warps of its callers (router at T = 1)
# The candidates' order is irrelevant (unique keys); letting Triton 3.6 reorder them keeps them in one warp (25
# barriers in the T = 1 router's build, 47 without). Triton 3.9 deprecates the flag and 3.10 drops it.
REORDER = tl.constexpr(tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9))


@triton.jit
def token_topk(logits_ptr, tok, E, EP: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, ROUND: tl.constexpr):
    """(ids [KP] int32, weights [KP] fp32) of token ``tok`` from the router logits ``[*, EP]`` fp32 (row stride
    EP, as ``router_logits_fused`` leaves them): ``_row_softmax_topk``, the function the router's last program
    runs at T = 1, so every caller gets the very ids and weights the router's own routing would have stored."""
    return _row_softmax_topk(logits_ptr + tok * EP, E, EP, K, KP, ROUND, ROW_SPLIT)


@triton.jit
def _topk_store(
    logits, rows, rmask, cols, E, ids_ptr, w_ptr, K: tl.constexpr, KP: tl.constexpr, ROUND: tl.constexpr
):
    """Top-k of the rows' logits stored into ``topk_ids`` / ``topk_weights`` [T, K]; -> (ids, valid, pair)."""
    kc = tl.arange(0, KP)
    ids, w = _softmax_topk(logits, cols, E, K, KP, ROUND)
    valid = rmask[:, None] & (kc[None, :] < K)
    pair = rows[:, None] * K + kc[None, :]
    tl.store(ids_ptr + pair, ids, mask=valid)
    tl.store(w_ptr + pair, w, mask=valid)
    return ids, valid, pair


@triton.jit
def _write_blocks(
    meta_ptr, counts, cols, E, T, N, MAXB, MAX_NB, BLOCK_M: tl.constexpr, HAS_SHARED: tl.constexpr
):
    """Block list from per-expert counts [EP]: the shared expert's cdiv(T, BLOCK_M) blocks first, then expert e's
    cdiv(count, BLOCK_M) blocks starting at its exclusive-cumsum row; then the count. The shared blocks come first
    because each of their programs also takes the shared expert's scalar gate (a second pass over its x rows in
    the gate_up kernel): last, those programs were the kernel's tail."""
    nsb = (T + BLOCK_M - 1) // BLOCK_M if HAS_SHARED else 0
    if HAS_SHARED:
        sj = tl.arange(0, 64)
        for s0 in range(0, nsb, 64):
            js = s0 + sj
            ms = js < nsb
            tl.store(meta_ptr + js, js * 0 + E, mask=ms)
            tl.store(meta_ptr + MAXB + js, N + js * BLOCK_M, mask=ms)
            tl.store(meta_ptr + 2 * MAXB + js, tl.minimum(T - js * BLOCK_M, BLOCK_M), mask=ms)
    nb = (counts + BLOCK_M - 1) // BLOCK_M
    boff = tl.cumsum(nb, axis=0) - nb + nsb
    start = tl.cumsum(counts, axis=0) - counts
    for j in range(0, MAX_NB):
        m = j < nb
        b = boff + j
        tl.store(meta_ptr + b, cols, mask=m)
        tl.store(meta_ptr + MAXB + b, start + j * BLOCK_M, mask=m)
        tl.store(meta_ptr + 2 * MAXB + b, tl.minimum(counts - j * BLOCK_M, BLOCK_M), mask=m)
    total = nsb + tl.sum(nb, axis=0)
    tl.store(meta_ptr + 3 * MAXB, total)


@triton.jit
def block_rows(meta_ptr, sorted_ptr, b, N, E, MAXB, BLOCK_M: tl.constexpr):
    """Block b of the block list ``_write_blocks`` wrote (b below its count) for the expert kernels: (e,
    is_shared, pos, rmask, routed, pair). e: its expert (E: the shared expert, is_shared); pos [BLOCK_M]: its
    routing rows; rmask: the rows it has (at most BLOCK_M, never padded); routed: those that are pairs (rows <
    N); pair: their pair ids t*k + j (0 elsewhere)."""
    e = tl.load(meta_ptr + b)
    row0 = tl.load(meta_ptr + MAXB + b)
    cnt = tl.load(meta_ptr + 2 * MAXB + b)
    is_shared = e == E
    r = tl.arange(0, BLOCK_M)
    rmask = r < cnt
    pos = row0 + r
    routed = rmask & (pos < N)
    pair = tl.load(sorted_ptr + pos, mask=routed, other=0)
    return e, is_shared, pos, rmask, routed, pair


@triton.jit
def _place_chunk(ids_ptr, sorted_ptr, key, N, c0, CHUNK: tl.constexpr):
    """sorted_pairs[rank(p)] = p for the pairs p in [c0, c0 + CHUNK), rank(p) = how many of the unique keys
    ``key`` [NP] (expert*N + pair, _BIG past N) are below p's: a counting sort by comparison (no tl.sort,
    whose xor-reductions the interpreter runs element by element)."""
    pi = c0 + tl.arange(0, CHUNK)
    m = pi < N
    kc_ = tl.where(m, tl.load(ids_ptr + pi, mask=m, other=0) * N + pi, _BIG)
    rank = tl.sum((key[None, :] < kc_[:, None]).to(tl.int32), axis=1)
    tl.store(sorted_ptr + rank, pi, mask=m)


@triton.jit
def _block_list(
    meta_ptr,
    ids,
    valid,
    T,
    E,
    N,
    MAXB,
    NP: tl.constexpr,
    EP: tl.constexpr,
    MAX_NB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_SHARED: tl.constexpr,
):
    """The block list from the pairs' experts ``ids`` [NP] (``valid``: the first N lanes)."""
    cols = tl.arange(0, EP)
    counts = tl.histogram(tl.where(valid, ids, 0), EP)
    counts = counts - tl.where(cols == 0, NP - N, 0)  # the padding lanes all went to bin 0
    _write_blocks(meta_ptr, counts, cols, E, T, N, MAXB, MAX_NB, BLOCK_M, HAS_SHARED)


@triton.jit
def _group_pairs(
    ids_ptr,
    sorted_ptr,
    meta_ptr,
    T,
    E,
    MAXB,
    K: tl.constexpr,
    NP: tl.constexpr,
    EP: tl.constexpr,
    MAX_NB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_SHARED: tl.constexpr,
):
    """One program groups the N = T*K pairs of ``topk_ids`` (already in memory, [N] flat; NP =
    next_pow2(N)) by expert: ``sorted_pairs`` and the block list."""
    N = T * K
    i = tl.arange(0, NP)
    valid = i < N
    ids = tl.load(ids_ptr + i, mask=valid, other=0)
    key = tl.where(valid, ids * N + i, _BIG)
    CHUNK: tl.constexpr = NP if NP < RANK_CHUNK else RANK_CHUNK
    for c0 in range(0, N, CHUNK):
        _place_chunk(ids_ptr, sorted_ptr, key, N, c0, CHUNK)
    _block_list(meta_ptr, ids, valid, T, E, N, MAXB, NP, EP, MAX_NB, BLOCK_M, HAS_SHARED)


@triton.jit
def _group_small(
    logits,
    rows,
    cols,
    T,
    E,
    MAXB,
    ids_ptr,
    w_ptr,
    sorted_ptr,
    meta_ptr,
    K: tl.constexpr,
    KP: tl.constexpr,
    TP: tl.constexpr,
    EP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROUND: tl.constexpr,
    HAS_SHARED: tl.constexpr,
):
    """One program: top-k of the [TP, EP] logits (fp32, -inf past E), then the expert grouping."""
    _topk_store(logits, rows, rows < T, cols, E, ids_ptr, w_ptr, K, KP, ROUND)
    tl.debug_barrier()  # the ids stored above are re-read by other threads of this program
    NP: tl.constexpr = TP * KP
    MAX_NB: tl.constexpr = (TP + BLOCK_M - 1) // BLOCK_M
    _group_pairs(ids_ptr, sorted_ptr, meta_ptr, T, E, MAXB, K, NP, EP, MAX_NB, BLOCK_M, HAS_SHARED)


@triton.jit(do_not_specialize=["T", "MAXB"])
def _group_kernel(
    ids_ptr,
    sorted_ptr,
    meta_ptr,
    T,
    E,
    MAXB,
    K: tl.constexpr,
    NP: tl.constexpr,
    EP: tl.constexpr,
    CHUNK: tl.constexpr,
    MAX_NB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(NP, CHUNK) + 1,), after ``_topk_kernel`` wrote ``topk_ids``: program c < last places the
    pairs [c*CHUNK, (c+1)*CHUNK) (each rank is a count over all N keys, independent of the other chunks);
    the last program writes the per-expert block list. No program reads another's output."""
    wait_for_previous(USE_PDL)
    pid = tl.program_id(0)
    N = T * K
    i = tl.arange(0, NP)
    valid = i < N
    ids = tl.load(ids_ptr + i, mask=valid, other=0)
    if pid < tl.num_programs(0) - 1:
        _place_chunk(ids_ptr, sorted_ptr, tl.where(valid, ids * N + i, _BIG), N, pid * CHUNK, CHUNK)
    else:
        _block_list(meta_ptr, ids, valid, T, E, N, MAXB, NP, EP, MAX_NB, BLOCK_M, HAS_SHARED)


@triton.jit(do_not_specialize=["T"])
def _topk_kernel(
    logits_ptr,
    stride_lt,
    ids_ptr,
    w_ptr,
    T,
    E,
    K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    EP: tl.constexpr,
    ROUND: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(T, BT),): softmax/top-k/renormalise of BT tokens per program, no grouping."""
    wait_for_previous(USE_PDL)
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.arange(0, EP)
    rmask = rows < T
    logits = _load_logits(logits_ptr, stride_lt, rows, rmask, cols, E)
    _topk_store(logits, rows, rmask, cols, E, ids_ptr, w_ptr, K, KP, ROUND)


@triton.jit(do_not_specialize=["T", "MAXB"])
def _route_small_kernel(
    logits_ptr,
    stride_lt,
    ids_ptr,
    w_ptr,
    sorted_ptr,
    meta_ptr,
    T,
    E,
    MAXB,
    K: tl.constexpr,
    KP: tl.constexpr,
    TP: tl.constexpr,
    EP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ROUND: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (1,): route T <= TP tokens and group their T*K pairs by expert (decode path)."""
    wait_for_previous(USE_PDL)
    rows = tl.arange(0, TP)
    cols = tl.arange(0, EP)
    logits = _load_logits(logits_ptr, stride_lt, rows, rows < T, cols, E)
    _group_small(
        logits,
        rows,
        cols,
        T,
        E,
        MAXB,
        ids_ptr,
        w_ptr,
        sorted_ptr,
        meta_ptr,
        K,
        KP,
        TP,
        EP,
        BLOCK_M,
        ROUND,
        HAS_SHARED,
    )


@triton.jit
def _route_kernel(
    logits_ptr,
    stride_lt,
    ids_ptr,
    w_ptr,
    counts_ptr,
    T,
    E,
    K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    EP: tl.constexpr,
    ROUND: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(T, BT),): top-k of BT tokens; counts[tb, e] = pairs of this token block on expert e."""
    wait_for_previous(USE_PDL)
    tb = tl.program_id(0)
    rows = tb * BT + tl.arange(0, BT)
    cols = tl.arange(0, EP)
    rmask = rows < T
    logits = _load_logits(logits_ptr, stride_lt, rows, rmask, cols, E)
    ids, valid, _ = _topk_store(logits, rows, rmask, cols, E, ids_ptr, w_ptr, K, KP, ROUND)
    P: tl.constexpr = BT * KP
    n_valid = tl.sum(tl.sum(valid.to(tl.int32), axis=1), axis=0)
    counts = tl.histogram(tl.reshape(tl.where(valid, ids, 0), [P]), EP)
    counts = counts - tl.where(cols == 0, P - n_valid, 0)
    tl.store(counts_ptr + tb * EP + cols, counts)


@triton.jit(do_not_specialize=["NTB", "T", "MAXB"])
def _align_scan_kernel(
    counts_ptr,
    base_ptr,
    meta_ptr,
    NTB,
    T,
    E,
    MAXB,
    K: tl.constexpr,
    EP: tl.constexpr,
    CT: tl.constexpr,
    RT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(NTB, CT),): program p owns token blocks [p*CT, (p+1)*CT). base[tb, e] = first row of expert
    e's pairs from token block tb, minus the index its first pair has in the token block's own expert-sorted
    order. Every program sums all the counts, RT token blocks a load (the per-expert totals, and separately
    the token blocks before its own), so no program waits for another and only its own CT rows take the two
    scans; program 0 also writes the block list."""
    wait_for_previous(USE_PDL)
    c0 = tl.program_id(0) * CT
    cols = tl.arange(0, EP)
    ct = tl.arange(0, CT)
    rt = tl.arange(0, RT)
    total = tl.zeros((EP,), dtype=tl.int32)
    pre = tl.zeros((EP,), dtype=tl.int32)  # pairs per expert from the token blocks before c0
    for r0 in range(0, NTB, RT):
        r = r0 + rt
        tile = tl.load(counts_ptr + r[:, None] * EP + cols[None, :], mask=(r < NTB)[:, None], other=0)
        total += tl.sum(tile, 0)
        pre += tl.sum(tl.where((r < c0)[:, None], tile, 0), 0)
    r = c0 + ct
    rm = (r < NTB)[:, None]
    tile = tl.load(counts_ptr + r[:, None] * EP + cols[None, :], mask=rm, other=0)
    running = tl.cumsum(total, axis=0) - total  # first row of each expert
    before = pre[None, :] + tl.cumsum(tile, axis=0) - tile  # earlier token blocks
    local = tl.cumsum(tile, axis=1) - tile  # start of expert e in the token block's sorted order
    tl.store(base_ptr + r[:, None] * EP + cols[None, :], running[None, :] + before - local, mask=rm)
    if c0 == 0:
        max_nb = tl.max((total + BLOCK_M - 1) // BLOCK_M, axis=0)
        _write_blocks(meta_ptr, total, cols, E, T, T * K, MAXB, max_nb, BLOCK_M, HAS_SHARED)


@triton.jit
def _align_scatter_kernel(
    ids_ptr,
    base_ptr,
    sorted_ptr,
    T,
    K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    EP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (NTB,): sort the token block's pairs by expert; pair i of that order goes to row base + i."""
    wait_for_previous(USE_PDL)
    tb = tl.program_id(0)
    lt = tl.arange(0, BT)
    kc = tl.arange(0, KP)
    rows = tb * BT + lt
    valid = (rows < T)[:, None] & (kc[None, :] < K)
    ids = tl.load(ids_ptr + rows[:, None] * K + kc[None, :], mask=valid, other=0)
    P: tl.constexpr = BT * KP
    key = tl.reshape(tl.where(valid, ids * P + lt[:, None] * KP + kc[None, :], _BIG), [P])
    rank = tl.sum((key[None, :] < key[:, None]).to(tl.int32), axis=1)  # index in the block's sorted order
    vm = tl.reshape(valid, [P])
    e = tl.reshape(ids, [P])
    pair = tl.reshape(rows[:, None] * K + kc[None, :], [P])
    base = tl.load(base_ptr + tb * EP + e, mask=vm, other=0)
    tl.store(sorted_ptr + base + rank, pair, mask=vm)


@triton.jit
def _route_rank_kernel(
    logits_ptr,
    stride_lt,
    ids_ptr,
    w_ptr,
    rank_ptr,
    cnt_ptr,
    T,
    E,
    K: tl.constexpr,
    KP: tl.constexpr,
    BT: tl.constexpr,
    EP: tl.constexpr,
    ROUND: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(T, BT),): top-k of BT tokens; rank[pair] = how many pairs of its expert drew the expert's
    counter before it (``cnt [E]``, zero before the launch)."""
    wait_for_previous(USE_PDL)
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.arange(0, EP)
    rmask = rows < T
    logits = _load_logits(logits_ptr, stride_lt, rows, rmask, cols, E)
    ids, valid, pair = _topk_store(logits, rows, rmask, cols, E, ids_ptr, w_ptr, K, KP, ROUND)
    rank = tl.atomic_add(cnt_ptr + ids, 1, mask=valid, sem="relaxed", scope="gpu")
    tl.store(rank_ptr + pair, rank, mask=valid)


@triton.jit(do_not_specialize=["T", "MAXB"])
def _place_kernel(
    ids_ptr,
    rank_ptr,
    cnt_ptr,
    sorted_ptr,
    meta_ptr,
    T,
    E,
    MAXB,
    K: tl.constexpr,
    EP: tl.constexpr,
    PB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (cdiv(T*K, PB),), after ``_route_rank_kernel``: pair p goes to row first[expert] + rank[p], first[e]
    the count of pairs on experts below e; program 0 writes the block list. ``cnt`` holds the E counters, then
    the ticket: the program that draws the last ticket zeroes both for the next launch (every program has read
    the counters before it draws one)."""
    wait_for_previous(USE_PDL)
    pid = tl.program_id(0)
    N = T * K
    cols = tl.arange(0, EP)
    counts = tl.load(cnt_ptr + cols, mask=cols < E, other=0, cache_modifier=".cg")
    p = pid * PB + tl.arange(0, PB)
    m = p < N
    e = tl.load(ids_ptr + p, mask=m, other=0)
    rank = tl.load(rank_ptr + p, mask=m, other=0)
    first = tl.sum(tl.where(cols[None, :] < e[:, None], counts[None, :], 0), axis=1)  # [PB]
    tl.store(sorted_ptr + first + rank, p, mask=m)
    if pid == 0:
        max_nb = tl.max((counts + BLOCK_M - 1) // BLOCK_M, axis=0)
        _write_blocks(meta_ptr, counts, cols, E, T, N, MAXB, max_nb, BLOCK_M, HAS_SHARED)
    tl.debug_barrier()  # every thread's reads of the counters come before the ticket
    ticket = tl.atomic_add(cnt_ptr + E, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        tl.store(cnt_ptr + cols, cols * 0, mask=cols < E)
        tl.atomic_xchg(cnt_ptr + E, 0, sem="relaxed", scope="gpu")


@dataclass
class Routing:
    """What the expert kernels read (see the module docstring)."""

    topk_ids: torch.Tensor  # [T, k] int32
    topk_weights: torch.Tensor  # [T, k] fp32
    sorted_pairs: torch.Tensor  # [T*k] int32
    meta: torch.Tensor  # [3*max_blocks + 1] int32
    max_blocks: int
    block_m: int
    normed_x: torch.Tensor | None = None  # [T, H] the fused router's RMS-normalised x (with a norm)
    logits: torch.Tensor | None = None  # [TP, EP] fp32 the fused router's logits (rows >= T unset)


def max_blocks(T: int, E: int, k: int, block_m: int, with_shared: bool) -> int:
    """Upper bound on the number of blocks: sum_e cdiv(c_e, BM) <= N // BM + #experts used (<= min(E, N))."""
    n = T * k
    routed = min(n, n // block_m + min(E, n))
    return max(1, routed + (triton.cdiv(T, block_m) if with_shared else 0))


def round_code(dtype: torch.dtype) -> int:
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 0)


def route_topk(
    logits: torch.Tensor, top_k: int, weight_dtype: torch.dtype, block_t: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (topk_ids [T, k] int32, topk_weights [T, k] fp32 rounded through weight_dtype).

    ``block_t``: tokens per program (grid cdiv(T, block_t)); default: as many as a 4096-element tile holds."""
    T, E = logits.shape
    ids = empty((T, top_k), torch.int32, logits.device)
    w = empty((T, top_k), torch.float32, logits.device)
    if T == 0:
        return ids, w
    EP = triton.next_power_of_2(E)
    bt = block_t or max(1, min(16, 4096 // EP))
    launch(
        _topk_kernel,
        (triton.cdiv(T, bt),),
        logits,
        logits.stride(0),
        ids,
        w,
        T,
        E,
        top_k,
        triton.next_power_of_2(top_k),
        bt,
        EP,
        round_code(weight_dtype),
        num_warps=4,
    )
    return ids, w


def small_routing(T: int, E: int, top_k: int) -> bool:
    """Whether T tokens take the single-program routing (and may take the fused router)."""
    return triton.next_power_of_2(T) * triton.next_power_of_2(top_k) <= SMALL_PAIRS and E <= 1024


def route_and_align(
    logits: torch.Tensor,
    top_k: int,
    block_m: int,
    with_shared: bool,
    weight_dtype: torch.dtype,
    force_large: bool = False,
    split: bool | None = None,
    atomic: bool = False,
) -> Routing:
    """Route T tokens (logits [T, E], any float dtype) and group the pairs by expert (T >= 1).

    ``split`` (small T only): top-k over a grid of programs, then the grouping over another (two launches)
    instead of one program doing both; None picks it from T (``SPLIT_MIN_TOKENS``). ``atomic`` (large T, or
    with ``force_large``): the two-launch grouping by atomic ranks (module docstring)."""
    T, E = logits.shape
    dev = logits.device
    require(logits.stride(1) == 1, "route_and_align: the logits need a contiguous last dim")
    n = T * top_k
    mb = max_blocks(T, E, top_k, block_m, with_shared)
    sorted_pairs = empty((n,), torch.int32, dev)
    meta = empty((3 * mb + 1,), torch.int32, dev)
    rnd = round_code(weight_dtype)
    EP = triton.next_power_of_2(E)
    KP = triton.next_power_of_2(top_k)
    TP = triton.next_power_of_2(T)
    if not small_routing(T, E, top_k) or force_large:
        ids, w = _route_large(logits, top_k, block_m, with_shared, rnd, mb, sorted_pairs, meta, atomic)
    elif split if split is not None else T >= SPLIT_MIN_TOKENS:
        ids, w = route_topk(logits, top_k, weight_dtype, SPLIT_BLOCK_T)
        np_ = triton.next_power_of_2(n)
        chunk = min(np_, GROUP_CHUNK)
        launch(
            _group_kernel,
            (np_ // chunk + 1,),
            ids,
            sorted_pairs,
            meta,
            T,
            E,
            mb,
            top_k,
            np_,
            EP,
            chunk,
            triton.cdiv(TP, block_m),
            block_m,
            with_shared,
            num_warps=4,
        )
    else:
        ids = empty((T, top_k), torch.int32, dev)
        w = empty((T, top_k), torch.float32, dev)
        launch(
            _route_small_kernel,
            (1,),
            logits,
            logits.stride(0),
            ids,
            w,
            sorted_pairs,
            meta,
            T,
            E,
            mb,
            top_k,
            KP,
            TP,
            EP,
            block_m,
            rnd,
            with_shared,
            num_warps=8 if TP * EP >= 4096 else 4,
        )
    return Routing(ids, w, sorted_pairs, meta, mb, block_m)


PLACE_PAIRS = 128  # pairs each program of ``_place_kernel`` places
# Tokens per top-k program of the atomic path at any T: with no scan over per-block counts, small blocks only add
# programs. Graph-replayed at 512 / 1024 / 2048 / 4096 / 8192 tokens with 4 tokens a program: 13.1 / 15.6 / 16.3 /
# 22.8 / 35.8 us; 2: 13.9 / 16.3 / 17.7 / 26.3 / 42.3; 16: 18.8 / 21.0 / 21.5 / 28.5 / 39.5; the scan path's best
# 14.6 / 19.8 / 27.2 / 39.3 / 65.2 (``bench --routing``, H200, 2026-12-05)
ATOMIC_BLOCK_T = 4


def _route_large(
    logits: torch.Tensor,
    top_k: int,
    block_m: int,
    with_shared: bool,
    rnd: int,
    mb: int,
    sorted_pairs: torch.Tensor,
    meta: torch.Tensor,
    atomic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k + per-token-block histograms, the scan, then the scatter (three launches); ``atomic``: top-k with
    atomic ranks, then the placement and the block list (two launches)."""
    T, E = logits.shape
    dev = logits.device
    EP = triton.next_power_of_2(E)
    KP = triton.next_power_of_2(top_k)
    ids = empty((T, top_k), torch.int32, dev)
    w = empty((T, top_k), torch.float32, dev)
    bt = ATOMIC_BLOCK_T if atomic else next(b for limit, b in LARGE_BLOCK_T if T <= limit)
    BT = max(1, min(bt, 4096 // EP, RANK_CHUNK.value // KP))
    ntb = triton.cdiv(T, BT)
    if atomic:
        rank = empty((T, top_k), torch.int32, dev)
        cnt = ticket_counters("moe_route_atomic", dev, E + 1, minimum=1025)  # E counters, then the ticket
        args = (logits, logits.stride(0), ids, w, rank, cnt, T, E, top_k, KP, BT, EP, rnd)
        launch(_route_rank_kernel, (ntb,), *args, num_warps=4)
        args = (ids, rank, cnt, sorted_pairs, meta, T, E, mb, top_k, EP, PLACE_PAIRS, block_m, with_shared)
        launch(_place_kernel, (triton.cdiv(T * top_k, PLACE_PAIRS),), *args, num_warps=4)
        return ids, w
    counts = empty((ntb, EP), torch.int32, dev)
    base = empty((ntb, EP), torch.int32, dev)
    launch(
        _route_kernel,
        (ntb,),
        logits,
        logits.stride(0),
        ids,
        w,
        counts,
        T,
        E,
        top_k,
        KP,
        BT,
        EP,
        rnd,
        num_warps=4,
    )
    CT = max(1, min(16, 4096 // EP))  # token blocks per scan program
    RT = max(1, min(64, 16384 // EP))  # token blocks per load of its pass over all the counts
    launch(
        _align_scan_kernel,
        (triton.cdiv(ntb, CT),),
        counts,
        base,
        meta,
        ntb,
        T,
        E,
        mb,
        top_k,
        EP,
        CT,
        RT,
        block_m,
        with_shared,
        num_warps=8,
    )
    launch(_align_scatter_kernel, (ntb,), ids, base, sorted_pairs, T, top_k, KP, BT, EP, num_warps=4)
    return ids, w
