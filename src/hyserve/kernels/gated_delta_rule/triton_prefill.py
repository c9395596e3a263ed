"""Chunked gated delta rule over packed varlen sequences (chunk 64): two Triton launches, no host sync.

Shapes: q, k [T, H, K] and v [T, HV, V] (model dtype; any token/head strides, last dim contiguous, e.g. the
views of the conv output), g [T, HV] fp32 log-decay, beta [T, HV], state [S, HV, K, V] fp32 (slots),
cu_seqlens [N+1], state_indices [N], has_initial_state [N]. Key head ``j = hv // (HV/H)``.

Per chunk of 64 tokens (``cum`` = in-chunk cumsum of g, ``D_ij = exp(cum_i - cum_j)`` for i >= j) the
reference's solve is ``T = (I + strictly-lower(beta_i k_i.k_j D_ij))^-1``, ``w = T (beta k exp(cum))``,
``u = T (beta v)``; then sequentially ``v_new = u - w S``, ``o = (q exp(cum)) S + (q k^T * D) v_new``,
``S <- exp(cum_last) S + (k exp(cum_last - cum))^T v_new``.

1. ``_prepare_kernel`` grid (chunks, HV): cumsum of g; the 64x64 system A from one dot of the raw k tile
   with itself (|k_i|^2 is its diagonal, so the L2 norms are row/column scales and no normalised [64, K]
   tile is ever built); T = (I + A)^-1 from the four 16x16 diagonal blocks inverted together by forward
   substitution on a [4, 16, 16] register tile, then (I - N)(I + N^2) D^-1 with N = D^-1 (block-lower A);
   w = T diag(beta e^cum / |k|) k, u = T diag(beta) v. Writes cum, 1/|k| [T, HV] fp32 and w [T, HV, K],
   u [T, HV, V] (model dtype, as fla). Fused variant (default): also q k^T * scales * D [T, HV, 64] and
   the q row scales, i.e. the S-independent half of the output.
2. ``_state_output_kernel`` grid (N, HV, V/BV) (default, ``fused_output``): the only sequential part. Per
   (sequence, head, V-tile) walk the chunks keeping S [K, BV] fp32 in registers: v_new = u - w S,
   o = diag(qs) q S + aqk v_new (stored), S <- e^{c_last} S + k^T diag(e^{c_last - c} / |k|) v_new; the
   two output dots feed nothing back, yet they are half the pass's time (they queue on the same warpgroup's
   tensor cores; every unfused or merged form measured slower, docs/performance.md 2026-12-06). Starts from the
   slot if has_initial_state else zeros; writes the final state into the slot.
   Unfused variant: ``_state_kernel`` stores the chunk start states h [chunks, HV, K, V] and v_new, and
   ``_output_kernel`` grid (chunks, HV, V/BV) computes o from them fully in parallel (3 launches, like
   fla); kept for the sweep.

Varlen without a host sync (CUDA-graph capturable): the per-chunk grids are an upper bound (T/64 + N);
each program finds its (sequence, chunk) from cu_seqlens in registers (one vector load + cumsum,
``_locate``), programs past the last chunk exit. q and k are L2-normalised (eps 1e-6) and q is scaled by
K**-0.5 in the kernels. Dots take raw model-dtype operands with fp32 accumulation (wgmma on sm_90); the
inverse's dots are fp32 in tf32 on the GPU (bf16/fp16 inputs) or exact ("ieee") for fp32 inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.gated_delta_rule.triton_decode import require_delta_rule_inputs

CHUNK = 64

# Tile configs (data, picked here by the wrapper): BV of the state / output kernels, warps, stages.
_CONFIGS = {
    "fused_output": True,  # _state_output_kernel (2 launches) instead of _state_kernel + _output_kernel (3)
    # 4 warps: 255 registers a thread fit two programs an SM (8 warps took 204 a thread: one), which halves the
    # waves of this latency-bound solve; 3 stages prefetch the state loop's next chunk one tile deeper
    # (`bench --sweep` on the H200, 2026-12-03: T=1024 125.7 -> 82.7 us, then 2 -> 3 stages 125.7 -> 112.0). With
    # the substitution's rows from the transposed blocks (ddb536a) 4 warps still win in the engine: 0.89 ms over 30
    # layers at 1024 tokens against 1.56 on 8 warps (3.65 / 6.47 ms at 4096; docs/performance.md, da8a110)
    "prepare": {"num_warps": 4},
    "state_output": {"BV": 32, "num_warps": 4, "num_stages": 3},
    "state": {"BV": 32, "num_warps": 4, "num_stages": 2},
    "output": {"BV": 64, "num_warps": 4},
}


@triton.jit
def _locate(cu_ptr, N, pid, CHUNK: tl.constexpr, BN: tl.constexpr):
    """(sequence, chunk within it, total chunks) of global chunk ``pid``; sequences are split in CHUNK-rows."""
    i = tl.arange(0, BN)
    m = i < N
    lo = tl.load(cu_ptr + i, mask=m, other=0).to(tl.int32)
    hi = tl.load(cu_ptr + i + 1, mask=m, other=0).to(tl.int32)
    cnt = (hi - lo + CHUNK - 1) // CHUNK
    ends = tl.cumsum(cnt, 0)
    seq = tl.sum((ends <= pid).to(tl.int32), 0)
    first = tl.sum(tl.where(i == seq, ends - cnt, 0), 0)
    return seq, pid - first, tl.sum(cnt, 0)


@triton.jit
def _chunk_inverse(a, PREC: tl.constexpr):
    """(I + a)^-1 for the strictly lower [64, 64] fp32 chunk system ``a``.

    D = the four 16x16 diagonal blocks of I + a, inverted together by forward substitution on a
    [4, 16, 16] tile (15 steps, elementwise, in registers; step i takes row i of each block from the
    transposed blocks by a reduction over their last axis, which lands in the layout the update broadcasts:
    no layout conversion a step, 40 CTA barriers in the sm_90 build of ``_prepare_kernel`` against 111
    when the row came from a reduction over the middle axis); L = the strictly block-lower part of a; then
    (D + L)^-1 = (I + N)^-1 D^-1 with N = D^-1 L nilpotent of order 4: (I - N)(I + N^2) D^-1.
    """
    r64 = tl.arange(0, 64)
    b4 = tl.arange(0, 4)
    r16 = tl.arange(0, 16)
    same = b4[:, None, None, None] == b4[None, None, :, None]  # [4, 1, 4, 1]: row block == column block
    diag = tl.sum(tl.where(same, tl.reshape(a, (4, 16, 4, 16)), 0.0), 2)  # [4, 16, 16]
    rows = r16[None, :, None]
    x = tl.where(rows == r16[None, None, :], 1.0, 0.0) + tl.zeros((4, 16, 16), tl.float32)
    d_t = tl.permute(diag, (0, 2, 1))  # [4, 16 (j), 16 (i)]
    for i in tl.static_range(1, 16):
        a_i = tl.sum(tl.where(r16[None, None, :] == i, d_t, 0.0), 2)  # [4, 16 (j)]: row i of each block
        row = tl.sum(a_i[:, :, None] * x, 1)  # sum_j a[i, j] x[j, :]; rows j < i are final
        x = tl.where(rows == i, x - row[:, None, :], x)
    d_inv = tl.reshape(tl.where(same, x[:, :, None, :], 0.0), (64, 64))
    lower = tl.where((r64[:, None] // 16) > (r64[None, :] // 16), a, 0.0)
    eye = tl.where(r64[:, None] == r64[None, :], 1.0, 0.0)
    n = tl.dot(d_inv, lower, input_precision=PREC)
    n2 = tl.dot(n, n, input_precision=PREC)
    p = tl.dot(eye - n, eye + n2, input_precision=PREC)
    return tl.dot(p, d_inv, input_precision=PREC)


@triton.jit(do_not_specialize=["N"])
def _prepare_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, w_ptr, u_ptr, cum_ptr, rk_ptr, aqk_ptr, qs_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_bt, N, scale,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, FUSED: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // G
    seq, chunk, total = _locate(cu_ptr, N, pid, 64, BN)
    if pid >= total:
        return
    start = tl.load(cu_ptr + seq).to(tl.int32) + chunk * 64
    end = tl.load(cu_ptr + seq + 1).to(tl.int32)
    rr = tl.arange(0, 64)
    rows = (start + rr).to(tl.int64)
    mr = rows < end
    ok = tl.arange(0, BK)
    ov = tl.arange(0, BV)
    # raw model-dtype tiles straight into the dots; the L2 norms become row/column scales of the outputs
    k = tl.load(
        k_ptr + rows[:, None] * stride_kt + i_h * stride_kh + ok[None, :],
        mask=mr[:, None] & (ok[None, :] < K),
        other=0.0,
    )
    v = tl.load(
        v_ptr + rows[:, None] * stride_vt + i_hv * stride_vh + ov[None, :],
        mask=mr[:, None] & (ov[None, :] < V),
        other=0.0,
    )
    g = tl.load(g_ptr + rows * stride_gt + i_hv, mask=mr, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * stride_bt + i_hv, mask=mr, other=0.0).to(tl.float32)
    cum = tl.cumsum(g, 0)  # padded rows add 0: the reference's zero padding
    tl.store(cum_ptr + rows * HV + i_hv, cum, mask=mr)

    kk = tl.dot(k, tl.trans(k), input_precision=PREC)  # [64, 64] fp32, exact products
    eye = rr[:, None] == rr[None, :]
    rk = tl.rsqrt(tl.sum(tl.where(eye, kk, 0.0), 1) + 1e-6)  # 1 / |k_i| (the diagonal), by row
    rk_c = tl.rsqrt(tl.sum(tl.where(eye, kk, 0.0), 0) + 1e-6)  # the same, by column
    tl.store(rk_ptr + rows * HV + i_hv, rk, mask=mr)
    strict = rr[:, None] > rr[None, :]
    decay = tl.exp(tl.where(strict, cum[:, None] - cum[None, :], float("-inf")))
    a = kk * (beta * rk)[:, None] * rk_c[None, :] * decay  # strictly lower: beta_i kn_i.kn_j exp(c_i - c_j)
    t = _chunk_inverse(a, PREC)
    # w = T diag(beta exp(cum) / |k|) k,  u = T diag(beta) v
    w = tl.dot((t * (beta * tl.exp(cum) * rk)[None, :]).to(DT), k, input_precision=PREC)
    u = tl.dot((t * beta[None, :]).to(DT), v, input_precision=PREC)
    tl.store(
        w_ptr + (rows[:, None] * HV + i_hv) * K + ok[None, :],
        w.to(w_ptr.dtype.element_ty),
        mask=mr[:, None] & (ok[None, :] < K),
    )
    tl.store(
        u_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :],
        u.to(u_ptr.dtype.element_ty),
        mask=mr[:, None] & (ov[None, :] < V),
    )
    if FUSED:  # the S-independent half of the output, for _state_output_kernel
        q = tl.load(
            q_ptr + rows[:, None] * stride_qt + i_h * stride_qh + ok[None, :],
            mask=mr[:, None] & (ok[None, :] < K),
            other=0.0,
        )
        qf = q.to(tl.float32)
        rq = tl.rsqrt(tl.sum(qf * qf, 1) + 1e-6) * scale  # scale / |q_i|
        causal = rr[:, None] >= rr[None, :]
        decay_c = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], float("-inf")))
        aqk = tl.dot(q, tl.trans(k), input_precision=PREC) * rq[:, None] * rk_c[None, :] * decay_c
        tl.store(
            aqk_ptr + (rows[:, None] * HV + i_hv) * 64 + rr[None, :],
            aqk.to(aqk_ptr.dtype.element_ty),
            mask=mr[:, None],
        )
        tl.store(qs_ptr + rows * HV + i_hv, rq * tl.exp(cum), mask=mr)


@triton.jit(do_not_specialize=["N"])
def _state_kernel(
    k_ptr, w_ptr, u_ptr, cum_ptr, rk_ptr, cu_ptr, state_ptr, idx_ptr, init_ptr, h_ptr, vnew_ptr,
    stride_kt, stride_kh, N,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // G
    # first global chunk of this sequence (same numbering as _locate)
    i = tl.arange(0, BN)
    m = i < N
    lo = tl.load(cu_ptr + i, mask=m, other=0).to(tl.int32)
    hi = tl.load(cu_ptr + i + 1, mask=m, other=0).to(tl.int32)
    first = tl.sum(tl.where(i < i_n, (hi - lo + 63) // 64, 0), 0)
    start = tl.load(cu_ptr + i_n).to(tl.int32)
    end = tl.load(cu_ptr + i_n + 1).to(tl.int32)
    n_chunks = (end - start + 63) // 64
    if n_chunks <= 0:
        return
    slot = tl.load(idx_ptr + i_n).to(tl.int64)
    k_init = tl.where(tl.load(init_ptr + i_n) != 0, K, 0)  # rows of the slot to read: all, or none

    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    s_off = ((slot * HV + i_hv) * K + ok[:, None]) * V + ov[None, :]
    s = tl.load(state_ptr + s_off, mask=(ok[:, None] < k_init) & mv[None, :], other=0.0)  # [BK, BV] fp32
    rr = tl.arange(0, 64)
    for c in range(n_chunks):
        t0 = start + c * 64
        rows = (t0 + rr).to(tl.int64)
        mr = rows < end
        h_off = (((first + c).to(tl.int64) * HV + i_hv) * K + ok[:, None]) * V + ov[None, :]
        tl.store(h_ptr + h_off, s.to(h_ptr.dtype.element_ty), mask=mk[:, None] & mv[None, :])
        w = tl.load(
            w_ptr + (rows[:, None] * HV + i_hv) * K + ok[None, :], mask=mr[:, None] & mk[None, :], other=0.0
        )
        u = tl.load(
            u_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], mask=mr[:, None] & mv[None, :], other=0.0
        )
        k = tl.load(
            k_ptr + rows[:, None] * stride_kt + i_h * stride_kh + ok[None, :],
            mask=mr[:, None] & mk[None, :],
            other=0.0,
        )
        cum = tl.load(cum_ptr + rows * HV + i_hv, mask=mr, other=0.0)
        rk = tl.load(rk_ptr + rows * HV + i_hv, mask=mr, other=0.0)
        cum_last = tl.load(cum_ptr + tl.minimum(t0 + 63, end - 1).to(tl.int64) * HV + i_hv)
        v_new = u.to(tl.float32) - tl.dot(w, s.to(DT), input_precision=PREC)
        tl.store(
            vnew_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :],
            v_new.to(DT),
            mask=mr[:, None] & mv[None, :],
        )
        # S <- exp(c_last) S + kn^T diag(exp(c_last - c)) v_new, the norm and decay applied to v_new's rows
        v_scaled = v_new * (tl.exp(cum_last - cum) * rk)[:, None]
        s = s * tl.exp(cum_last) + tl.dot(tl.trans(k), v_scaled.to(DT), input_precision=PREC)
    tl.store(state_ptr + s_off, s, mask=mk[:, None] & mv[None, :])


@triton.jit(do_not_specialize=["N"])
def _state_output_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, cum_ptr, rk_ptr, aqk_ptr, qs_ptr, cu_ptr, state_ptr, idx_ptr, init_ptr, o_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh, N,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """_state_kernel with the output fused into the chunk loop (no h / v_new round trip, one launch less):
    o = diag(qs) q S + aqk v_new, where aqk and qs (scale exp(cum) / |q|) come from _prepare_kernel. The
    two extra dots read S and v_new and feed nothing back, but they take half the loop's time (the module
    docstring)."""
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // G
    start = tl.load(cu_ptr + i_n).to(tl.int32)
    end = tl.load(cu_ptr + i_n + 1).to(tl.int32)
    n_chunks = (end - start + 63) // 64
    if n_chunks <= 0:
        return
    slot = tl.load(idx_ptr + i_n).to(tl.int64)
    k_init = tl.where(tl.load(init_ptr + i_n) != 0, K, 0)  # rows of the slot to read: all, or none

    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    s_off = ((slot * HV + i_hv) * K + ok[:, None]) * V + ov[None, :]
    s = tl.load(state_ptr + s_off, mask=(ok[:, None] < k_init) & mv[None, :], other=0.0)  # [BK, BV] fp32
    rr = tl.arange(0, 64)
    for c in range(n_chunks):
        t0 = start + c * 64
        rows = (t0 + rr).to(tl.int64)
        mr = rows < end
        w = tl.load(
            w_ptr + (rows[:, None] * HV + i_hv) * K + ok[None, :], mask=mr[:, None] & mk[None, :], other=0.0
        )
        u = tl.load(
            u_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], mask=mr[:, None] & mv[None, :], other=0.0
        )
        k = tl.load(
            k_ptr + rows[:, None] * stride_kt + i_h * stride_kh + ok[None, :],
            mask=mr[:, None] & mk[None, :],
            other=0.0,
        )
        q = tl.load(
            q_ptr + rows[:, None] * stride_qt + i_h * stride_qh + ok[None, :],
            mask=mr[:, None] & mk[None, :],
            other=0.0,
        )
        aqk = tl.load(aqk_ptr + (rows[:, None] * HV + i_hv) * 64 + rr[None, :], mask=mr[:, None], other=0.0)
        cum = tl.load(cum_ptr + rows * HV + i_hv, mask=mr, other=0.0)
        rk = tl.load(rk_ptr + rows * HV + i_hv, mask=mr, other=0.0)
        qs = tl.load(qs_ptr + rows * HV + i_hv, mask=mr, other=0.0)
        cum_last = tl.load(cum_ptr + tl.minimum(t0 + 63, end - 1).to(tl.int64) * HV + i_hv)
        s_dt = s.to(DT)
        v_new = u.to(tl.float32) - tl.dot(w, s_dt, input_precision=PREC)
        o = tl.dot(q, s_dt, input_precision=PREC) * qs[:, None]
        o += tl.dot(aqk, v_new.to(DT), input_precision=PREC)
        tl.store(
            o_ptr + rows[:, None] * stride_ot + i_hv * stride_oh + ov[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=mr[:, None] & mv[None, :],
        )
        v_scaled = v_new * (tl.exp(cum_last - cum) * rk)[:, None]
        s = s * tl.exp(cum_last) + tl.dot(tl.trans(k), v_scaled.to(DT), input_precision=PREC)
    tl.store(state_ptr + s_off, s, mask=mk[:, None] & mv[None, :])


@triton.jit(do_not_specialize=["N"])
def _output_kernel(
    q_ptr, k_ptr, cum_ptr, rk_ptr, h_ptr, vnew_ptr, o_ptr, cu_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh, N, scale,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // G
    seq, chunk, total = _locate(cu_ptr, N, pid, 64, BN)
    if pid >= total:
        return
    start = tl.load(cu_ptr + seq).to(tl.int32) + chunk * 64
    end = tl.load(cu_ptr + seq + 1).to(tl.int32)

    rr = tl.arange(0, 64)
    rows = (start + rr).to(tl.int64)
    mr = rows < end
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + i_h * stride_qh + ok[None, :],
        mask=mr[:, None] & mk[None, :],
        other=0.0,
    )
    k = tl.load(
        k_ptr + rows[:, None] * stride_kt + i_h * stride_kh + ok[None, :],
        mask=mr[:, None] & mk[None, :],
        other=0.0,
    )
    qf = q.to(tl.float32)
    rq = tl.rsqrt(tl.sum(qf * qf, 1) + 1e-6) * scale  # scale / |q_i|
    rk = tl.load(rk_ptr + rows * HV + i_hv, mask=mr, other=0.0)
    cum = tl.load(cum_ptr + rows * HV + i_hv, mask=mr, other=0.0)
    causal = rr[:, None] >= rr[None, :]
    decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], float("-inf")))
    attn = tl.dot(q, tl.trans(k), input_precision=PREC) * rq[:, None] * rk[None, :] * decay  # [64, 64]
    h = tl.load(
        h_ptr + ((pid.to(tl.int64) * HV + i_hv) * K + ok[:, None]) * V + ov[None, :],
        mask=mk[:, None] & mv[None, :],
        other=0.0,
    )
    v_new = tl.load(
        vnew_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], mask=mr[:, None] & mv[None, :], other=0.0
    )
    o = tl.dot(q, h, input_precision=PREC) * (rq * tl.exp(cum))[:, None]
    o += tl.dot(attn.to(DT), v_new, input_precision=PREC)
    tl.store(
        o_ptr + rows[:, None] * stride_ot + i_hv * stride_oh + ov[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=mr[:, None] & mv[None, :],
    )


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _as_int8(flags: torch.Tensor) -> torch.Tensor:
    """bool -> int8 without a copy kernel (same item size)."""
    return flags.view(torch.int8) if flags.dtype == torch.bool else flags.to(torch.int8)


POISON_SCRATCH = False  # tests: fill the intermediates with NaN to catch reads of unwritten rows


def _scratch(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if POISON_SCRATCH:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(n))


def gated_delta_rule_prefill_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    configs: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as ``gated_delta_rule_prefill_reference``; no host synchronisation.

    ``configs`` overrides entries of ``_CONFIGS``; ``out`` [T, HV, V] receives o (else allocated)."""
    cfg = {**_CONFIGS, **(configs or {})}
    t, h, kd = q.shape
    hv, vd = v.shape[1], v.shape[2]
    n = state_indices.shape[0]
    require_delta_rule_inputs(q, k, v, state)
    if out is None:
        out = torch.empty((t, hv, vd), device=v.device, dtype=v.dtype)
    if t == 0 or n == 0:
        return out
    g = g if g.stride(-1) == 1 else g.contiguous()
    beta = beta if beta.stride(-1) == 1 else beta.contiguous()
    has_initial_state = _as_int8(has_initial_state)
    group = hv // h
    # BN (lanes of the sequence search) has a floor of 64 so that every batch of up to 64 sequences shares
    # one compiled variant: a step's sequence count must not trigger a compilation while serving
    bk, bvf, bn = _pow2(kd), _pow2(vd), _pow2(n, floor=64)
    max_chunks = triton.cdiv(t, CHUNK) + n
    dt = q.dtype
    prec = "ieee" if dt == torch.float32 else "tf32"  # tf32: fp32-operand dots of the solve, on the GPU
    fused = cfg["fused_output"]
    cum = _scratch((t, hv), torch.float32, q.device)
    rk = _scratch((t, hv), torch.float32, q.device)
    w = _scratch((t, hv, kd), dt, q.device)
    u = _scratch((t, hv, vd), dt, q.device)
    aqk = _scratch((t, hv, CHUNK), dt, q.device) if fused else cum  # (unused pointers when not fused)
    qs = _scratch((t, hv), torch.float32, q.device) if fused else cum
    meta = dict(HV=hv, G=group, K=kd, V=vd, BK=bk, DT=_TL_DTYPES[dt], PREC=prec)
    _prepare_kernel[(max_chunks, hv)](
        q, k, v, g, beta, cu_seqlens, w, u, cum, rk, aqk, qs,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        n, kd**-0.5, **meta, BV=bvf, BN=bn, FUSED=fused, num_warps=cfg["prepare"]["num_warps"],
    )  # fmt: skip
    if fused:
        bv = min(cfg["state_output"]["BV"], bvf)
        _state_output_kernel[(n, hv, triton.cdiv(vd, bv))](
            q, k, w, u, cum, rk, aqk, qs, cu_seqlens, state, state_indices, has_initial_state, out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1), n, **meta, BV=bv,
            num_warps=cfg["state_output"]["num_warps"], num_stages=cfg["state_output"]["num_stages"],
        )  # fmt: skip
        return out
    v_new = _scratch((t, hv, vd), dt, q.device)
    hstate = _scratch((max_chunks, hv, kd, vd), dt, q.device)
    bv = min(cfg["state"]["BV"], bvf)
    _state_kernel[(n, hv, triton.cdiv(vd, bv))](
        k, w, u, cum, rk, cu_seqlens, state, state_indices, has_initial_state, hstate, v_new,
        k.stride(0), k.stride(1), n, **meta, BV=bv, BN=bn,
        num_warps=cfg["state"]["num_warps"], num_stages=cfg["state"]["num_stages"],
    )  # fmt: skip
    bv = min(cfg["output"]["BV"], bvf)
    _output_kernel[(max_chunks, hv, triton.cdiv(vd, bv))](
        q, k, cum, rk, hstate, v_new, out, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1), n, kd**-0.5,
        **meta, BV=bv, BN=bn, num_warps=cfg["output"]["num_warps"],
    )  # fmt: skip
    return out
