"""Fused Gated DeltaNet decode step: conv1d+SiLU -> gates -> recurrent delta rule -> gated RMSNorm, one launch.

Shapes: mixed_qkv [B, D = 2*H*K + HV*V] (channels [q | k | v], head-major), z [B, HV, V], a, b [B, HV],
conv_weight [D, W], A_log, dt_bias [HV], norm_weight [V], conv_state [S, W-1, D] (model dtype),
ssm_state [S, HV, K, V] fp32, state_indices [B] -> o [B, HV, V] (model dtype).

Grid (B, HV, NV = V/BV). Program (b, hv, t) owns the [K, BV] fp32 state tile of value head hv (the bytes
that bound decode: 2 MB per sequence and layer). It loads the conv windows of the channels it needs: the
K q-channels and K k-channels of key head j = hv // (HV/H), and its BV v-channels; computes conv + SiLU
(rounded to the model dtype like the unfused path), the q/k L2 norms over the full K (recomputed by
every program of the key head: 2K multiply-adds), the gates, the state update and o.

Conv state, written exactly once per channel, never read after it is overwritten:
  * v channels are read by one program only: it reads its window, then (after a CTA barrier) shifts it.
  * q/k channels of key head j are read by the G*NV programs (b, hv in head j, any t): each program takes
    a ticket (``atomic_add`` acq_rel on a per-(b, j) counter) only after it has consumed its windows; the
    program that draws the last ticket knows every reader is done, shifts the q/k windows and resets the
    counter to 0. No program waits on another (no spin), so any scheduling order is safe, and the
    counters are back to zero after every launch (CUDA-graph safe). They are ``kernels/tickets.py``
    counters (``_workspace``), allocated outside any capture.

Gated RMSNorm needs the whole V of a head. NV == 1 (BV = V): done in the program. NV > 1: each program
stores its o tile (rounded to the model dtype, as the unfused path does before the norm), then (CTA
barrier, acq_rel ticket on a per-(b, hv) counter) the last one reloads the V values (.cg), normalises and
overwrites them.

Tiles (``_CONFIGS``, by batch size, from ``bench.py --sweep`` on the H200, 2026-12-02; B=3-4 moved to BV=32 by the
step tuner on 2026-12-04, a batch-4 step 3572 -> 3558 us): B <= 4: BV=32, 4
warps (B=1: 32 heads x 4 tiles = 128 programs, 6.9 us); larger: BV=128, 4 warps (one program per head, no
norm ticket; B=32: 48 us = 2.8 TB/s against 133 us for BV=64 x 8 warps). Split tiles, and whole-head tiles up
to batch ``_EARLY_MAX_BATCH``, load the state tile, the conv windows and the gate parameters before the PDL
wait (``EARLY``); the register-heavy whole-head tiles of larger batches load the state after the conv. The
whole-head tile with the early loads wins alone at B=2-4 (``bench``) but loses in the graph-replayed step at
B=1, 2 and 4 (it adds 26 / 27 / 21 us more to the step; docs/performance.md, 8dab29b), so the small batches
keep BV=32.
Padding rows must still point at distinct slots (or one scratch slot whose content does not matter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyserve.kernels.contracts import require
from hyserve.kernels.gdn_gating.triton_kernel import softplus
from hyserve.kernels.pdl import launch_options, wait_for_previous
from hyserve.kernels.tickets import ticket_counters

# batch size bound -> (BV, num_warps); the first entry whose bound is >= B
_CONFIGS = ((4, 32, 4), (1 << 30, 128, 4))
# up to this batch the whole-head tile (BV = V) also loads its state, conv windows and gate parameters before
# the PDL wait (``EARLY``); split tiles (BV < V) always do
_EARLY_MAX_BATCH = 4

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _conv_window4(convw_ptr, c_base, ch, chm, D):
    """The inputs of a width-4 conv over channels ch [BC] that no running kernel writes: the 4 taps and the 3
    state rows (each [BC], the state in its stored dtype), loaded one row each so that no row has to be
    picked out of a 2-D tile later (a reduction across warps)."""
    t0 = tl.load(convw_ptr + ch * 4, mask=chm, other=0.0).to(tl.float32)
    t1 = tl.load(convw_ptr + ch * 4 + 1, mask=chm, other=0.0).to(tl.float32)
    t2 = tl.load(convw_ptr + ch * 4 + 2, mask=chm, other=0.0).to(tl.float32)
    t3 = tl.load(convw_ptr + ch * 4 + 3, mask=chm, other=0.0).to(tl.float32)
    h0 = tl.load(c_base + ch, mask=chm, other=0.0)
    h1 = tl.load(c_base + D + ch, mask=chm, other=0.0)
    h2 = tl.load(c_base + 2 * D + ch, mask=chm, other=0.0)
    return t0, t1, t2, t3, h0, h1, h2


@triton.jit
def _conv4(x, t0, t1, t2, t3, h0, h1, h2, X_DT: tl.constexpr):
    """x * t3 + h0 t0 + h1 t1 + h2 t2 in fp32, in the order and roundings of the one-tap-at-a-time loop."""
    acc = x.to(tl.float32) * t3
    acc += h0.to(X_DT).to(tl.float32) * t0
    acc += h1.to(X_DT).to(tl.float32) * t1
    acc += h2.to(X_DT).to(tl.float32) * t2
    return acc


@triton.jit
def _gdn_decode_step_kernel(
    x_ptr, z_ptr, a_ptr, b_ptr, convw_ptr, alog_ptr, dtb_ptr, normw_ptr,
    conv_ptr, ssm_ptr, idx_ptr, o_ptr, cnt_qk_ptr, cnt_o_ptr,
    stride_xb, stride_zb, stride_zh, stride_ab, stride_bb, eps, scale,
    H: tl.constexpr, HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr, NV: tl.constexpr, NW_DT: tl.constexpr,
    EARLY: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    i_b = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // G
    D = 2 * H * K + HV * V
    X_DT = x_ptr.dtype.element_ty
    C_DT = conv_ptr.dtype.element_ty
    b64 = i_b.to(tl.int64)
    slot = tl.load(idx_ptr + i_b).to(tl.int64)

    ok = tl.arange(0, BK)
    mk = ok < K
    ov = i_v * BV + tl.arange(0, BV)
    mv = ov < V
    s_off = ((slot * HV + i_hv) * K + ok[:, None]) * V + ov[None, :]
    EVEN: tl.constexpr = (K == BK) and (V % BV == 0)  # no masks: lets the compiler vectorise the tile
    if EARLY:  # the fp32 state tile first, before the wait: its latency overlaps the previous kernel's tail
        if EVEN:
            s = tl.load(ssm_ptr + s_off)
        else:
            s = tl.load(ssm_ptr + s_off, mask=mk[:, None] & mv[None, :], other=0.0)
    o_base = o_ptr + (b64 * HV + i_hv) * V
    z_base = z_ptr + b64 * stride_zb + i_hv * stride_zh
    of = tl.arange(0, BVF)
    mf = of < V
    # EARLY (small batches: latency-bound) loads the gate parameters (weights, before the wait), a, b and the
    # z row (the previous kernel's, right after it) up front rather than after the conv's barrier and ticket,
    # which order later loads behind them; the register-heavy big tiles of large batches keep them late.
    # With the model's width-4 conv it also loads the conv taps (weights) and the conv state rows (last
    # written by this layer's previous step) before the wait, so only the qkv row is left after it.
    cq = i_h * K + ok
    ck = H * K + i_h * K + ok
    cv = 2 * H * K + i_hv * V + ov
    c_base = conv_ptr + slot * ((W - 1) * D)
    EARLY_CONV: tl.constexpr = EARLY and W == 4
    if EARLY:
        dtb = tl.load(dtb_ptr + i_hv).to(tl.float32)
        a_log = tl.load(alog_ptr + i_hv).to(tl.float32)
        nw_full = tl.load(normw_ptr + of, mask=mf, other=0.0).to(tl.float32)
    if EARLY_CONV:
        tq0, tq1, tq2, tq3, hq0, hq1, hq2 = _conv_window4(convw_ptr, c_base, cq, mk, D)
        tk0, tk1, tk2, tk3, hk0, hk1, hk2 = _conv_window4(convw_ptr, c_base, ck, mk, D)
        tv0, tv1, tv2, tv3, hv0, hv1, hv2 = _conv_window4(convw_ptr, c_base, cv, mv, D)
    # the slot indices (staged before the step) and the state (last written by this layer's previous step)
    # are no output of the previous kernel: they load while it finishes; its qkv/z/a/b only after this
    wait_for_previous(USE_PDL)
    if EARLY:
        a_raw = tl.load(a_ptr + b64 * stride_ab + i_hv)
        b_raw = tl.load(b_ptr + b64 * stride_bb + i_hv)
        z_full = tl.load(z_base + of, mask=mf, other=0.0).to(tl.float32)

    # causal conv over [conv_state rows 0..W-2, x] and SiLU, per channel group
    x_base = x_ptr + b64 * stride_xb
    xq = tl.load(x_base + cq, mask=mk, other=0.0)
    xk = tl.load(x_base + ck, mask=mk, other=0.0)
    xv = tl.load(x_base + cv, mask=mv, other=0.0)
    if EARLY_CONV:
        q = _conv4(xq, tq0, tq1, tq2, tq3, hq0, hq1, hq2, X_DT)
        k = _conv4(xk, tk0, tk1, tk2, tk3, hk0, hk1, hk2, X_DT)
        v = _conv4(xv, tv0, tv1, tv2, tv3, hv0, hv1, hv2, X_DT)
    else:  # big tiles: one tap at a time (registers)
        q = xq.to(tl.float32) * tl.load(convw_ptr + cq * W + (W - 1), mask=mk, other=0.0).to(tl.float32)
        k = xk.to(tl.float32) * tl.load(convw_ptr + ck * W + (W - 1), mask=mk, other=0.0).to(tl.float32)
        v = xv.to(tl.float32) * tl.load(convw_ptr + cv * W + (W - 1), mask=mv, other=0.0).to(tl.float32)
        for w in tl.static_range(W - 1):
            hq = tl.load(c_base + w * D + cq, mask=mk, other=0.0).to(X_DT).to(tl.float32)
            hk = tl.load(c_base + w * D + ck, mask=mk, other=0.0).to(X_DT).to(tl.float32)
            h_v = tl.load(c_base + w * D + cv, mask=mv, other=0.0).to(X_DT).to(tl.float32)
            q += hq * tl.load(convw_ptr + cq * W + w, mask=mk, other=0.0).to(tl.float32)
            k += hk * tl.load(convw_ptr + ck * W + w, mask=mk, other=0.0).to(tl.float32)
            v += h_v * tl.load(convw_ptr + cv * W + w, mask=mv, other=0.0).to(tl.float32)
    q = (q * tl.sigmoid(q)).to(X_DT).to(tl.float32)
    k = (k * tl.sigmoid(k)).to(X_DT).to(tl.float32)
    v = (v * tl.sigmoid(v)).to(X_DT).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)

    # every conv window read above is consumed: publish the new conv state
    tl.debug_barrier()
    if EARLY_CONV:
        # The ticket first, release only: the fence in front of it has no store of this program to wait
        # for, and nothing after it waits for its round trip; the last program acquires and shifts the q/k
        # windows after its o store. Rows 1 and 2 of the v windows (this program's own) are in registers.
        if G * NV > 1:
            ticket = tl.atomic_add(cnt_qk_ptr + b64 * H + i_h, 1, sem="release")
            last_qk = ticket == G * NV - 1
        else:
            last_qk = True
        tl.store(c_base + cv, hv1, mask=mv)
        tl.store(c_base + D + cv, hv2, mask=mv)
    else:
        for w in tl.static_range(W - 2):
            tl.store(c_base + w * D + cv, tl.load(c_base + (w + 1) * D + cv, mask=mv), mask=mv)
    tl.store(c_base + (W - 2) * D + cv, xv.to(C_DT), mask=mv)
    if not EARLY_CONV:
        if G * NV > 1:
            ticket = tl.atomic_add(cnt_qk_ptr + b64 * H + i_h, 1, sem="acq_rel")
            last_qk = ticket == G * NV - 1
        else:
            last_qk = True
        if last_qk:  # every reader of this key head's q/k windows is done
            for w in tl.static_range(W - 2):
                tl.store(c_base + w * D + cq, tl.load(c_base + (w + 1) * D + cq, mask=mk), mask=mk)
                tl.store(c_base + w * D + ck, tl.load(c_base + (w + 1) * D + ck, mask=mk), mask=mk)
            tl.store(c_base + (W - 2) * D + cq, xq.to(C_DT), mask=mk)
            tl.store(c_base + (W - 2) * D + ck, xk.to(C_DT), mask=mk)
            if G * NV > 1:
                tl.store(cnt_qk_ptr + b64 * H + i_h, 0)

    # gates (fp32, beta rounded to b's dtype like b.sigmoid())
    if not EARLY:
        dtb = tl.load(dtb_ptr + i_hv).to(tl.float32)
        a_log = tl.load(alog_ptr + i_hv).to(tl.float32)
        a_raw = tl.load(a_ptr + b64 * stride_ab + i_hv)
        b_raw = tl.load(b_ptr + b64 * stride_bb + i_hv)
    a = a_raw.to(tl.float32) + dtb
    g = -tl.exp(a_log) * softplus(a)
    beta = tl.sigmoid(b_raw.to(tl.float32)).to(b_raw.dtype).to(tl.float32)

    if not EARLY:  # big tiles: keep the conv's registers and the tile's apart
        if EVEN:
            s = tl.load(ssm_ptr + s_off)
        else:
            s = tl.load(ssm_ptr + s_off, mask=mk[:, None] & mv[None, :], other=0.0)
    # delta rule on the tile
    s = s * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], 0)) * beta
    s = s + k[:, None] * delta[None, :]
    if EVEN:
        tl.store(ssm_ptr + s_off, s)
    else:
        tl.store(ssm_ptr + s_off, s, mask=mk[:, None] & mv[None, :])
    o = tl.sum(s * q[:, None], 0).to(X_DT).to(tl.float32)  # the unfused path rounds o before the norm

    if NV == 1:
        var = tl.sum(o * o, 0) / V
        hn = (o * tl.rsqrt(var + eps)).to(X_DT).to(tl.float32)
        if EARLY:
            nw = nw_full
            zz = z_full
        else:
            nw = tl.load(normw_ptr + ov, mask=mv, other=0.0).to(tl.float32)
            zz = tl.load(z_base + ov, mask=mv, other=0.0).to(tl.float32)
        y = (nw * hn).to(NW_DT).to(tl.float32) * (zz * tl.sigmoid(zz))
        tl.store(o_base + ov, y.to(X_DT), mask=mv)
    else:
        tl.store(o_base + ov, o.to(X_DT), mask=mv)
    if EARLY_CONV and last_qk:  # every reader of this key head's q/k windows has released its ticket
        cnt = cnt_qk_ptr + b64 * H + i_h
        if G * NV > 1:  # their reads before these stores; the counter back to 0
            tl.atomic_xchg(cnt, 0, sem="acquire")
        tl.store(c_base + cq, hq1, mask=mk)
        tl.store(c_base + D + cq, hq2, mask=mk)
        tl.store(c_base + 2 * D + cq, xq.to(C_DT), mask=mk)
        tl.store(c_base + ck, hk1, mask=mk)
        tl.store(c_base + D + ck, hk2, mask=mk)
        tl.store(c_base + 2 * D + ck, xk.to(C_DT), mask=mk)
    if NV > 1:
        tl.debug_barrier()
        ticket_o = tl.atomic_add(cnt_o_ptr + b64 * HV + i_hv, 1, sem="acq_rel")
        if ticket_o == NV - 1:  # all tiles of this head are stored: normalise the head
            oh = tl.load(o_base + of, mask=mf, other=0.0, cache_modifier=".cg").to(tl.float32)
            var = tl.sum(oh * oh, 0) / V
            hn = (oh * tl.rsqrt(var + eps)).to(X_DT).to(tl.float32)
            if not EARLY:
                nw_full = tl.load(normw_ptr + of, mask=mf, other=0.0).to(tl.float32)
                z_full = tl.load(z_base + of, mask=mf, other=0.0).to(tl.float32)
            y = (nw_full * hn).to(NW_DT).to(tl.float32) * (z_full * tl.sigmoid(z_full))
            tl.store(o_base + of, y.to(X_DT), mask=mf)
            tl.store(cnt_o_ptr + b64 * HV + i_hv, 0)


def _workspace(device: torch.device, n: int) -> torch.Tensor:
    """The step's ticket counters (``kernels/tickets.py``)."""
    return ticket_counters("DeltaNet decode step", device, n, minimum=1 << 16)


def decode_step_config(batch: int) -> tuple[int, int]:
    for bound, bv, warps in _CONFIGS:
        if batch <= bound:
            return bv, warps
    raise AssertionError


def early_loads(v_tiles: int, batch: int) -> bool:
    """The kernel's ``EARLY`` for ``v_tiles`` = V / BV programs a head at ``batch`` sequences."""
    return v_tiles > 1 or batch <= _EARLY_MAX_BATCH


def gdn_decode_step_triton(
    mixed_qkv: torch.Tensor,
    z: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    state_indices: torch.Tensor,
    block_v: int | None = None,
    num_warps: int | None = None,
    out: torch.Tensor | None = None,
    early: bool | None = None,
) -> torch.Tensor:
    """Same contract as ``gdn_decode_step_reference``; ``block_v``/``num_warps``/``early`` override the config,
    ``out`` [B, HV, V] contiguous receives o (else allocated)."""
    batch, dim = mixed_qkv.shape
    _, hv, kd, vd = ssm_state.shape
    width = conv_weight.shape[-1]
    h = (dim - hv * vd) // (2 * kd)
    require(
        mixed_qkv.stride(-1) == 1
        and z.stride(-1) == 1
        and conv_state.is_contiguous()
        and ssm_state.is_contiguous(),
        "gdn_decode_step: mixed_qkv and z need a contiguous last dim, conv_state and ssm_state must be contiguous",
    )
    require(
        conv_state.shape[1:] == (width - 1, dim) and 2 * h * kd + hv * vd == dim and width >= 2,
        "gdn_decode_step: conv_state must be [S, W-1, D] with D = 2*H*K + HV*V the mixed_qkv width, and W >= 2",
    )
    if out is None:
        out = torch.empty((batch, hv, vd), device=mixed_qkv.device, dtype=mixed_qkv.dtype)
    require(out.is_contiguous(), "gdn_decode_step: out must be contiguous")
    if batch == 0:
        return out
    conv_weight = conv_weight.reshape(dim, width)
    conv_weight = conv_weight if conv_weight.is_contiguous() else conv_weight.contiguous()
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    bv, warps = decode_step_config(batch)
    bk, bvf = max(16, triton.next_power_of_2(kd)), max(16, triton.next_power_of_2(vd))
    bv = min(block_v or bv, bvf)
    nv = triton.cdiv(vd, bv)
    early = early_loads(nv, batch) if early is None else early
    ws = _workspace(mixed_qkv.device, batch * (h + hv))
    nw_dt = _TL_DTYPES[torch.promote_types(norm_weight.dtype, mixed_qkv.dtype)]
    _gdn_decode_step_kernel[(batch, hv, nv)](
        mixed_qkv, z, a, b, conv_weight, A_log, dt_bias, norm_weight,
        conv_state, ssm_state, state_indices, out, ws, ws[batch * h :],
        mixed_qkv.stride(0), z.stride(0), z.stride(1), a.stride(0), b.stride(0), eps, kd**-0.5,
        H=h, HV=hv, G=hv // h, K=kd, V=vd, W=width, BK=bk, BV=bv, BVF=bvf, NV=nv,
        NW_DT=nw_dt, EARLY=early, num_warps=num_warps or warps, **launch_options(out),
    )  # fmt: skip
    return out
