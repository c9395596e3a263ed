"""Probe: where the chunked DeltaNet prefill's serial state pass spends its time, and a one-dot chain.

``python scripts/probe_gdn_state_chain.py [--lens 1024,4096]`` (GPU; ``TRITON_INTERPRET=1`` on the CPU runs a
tiny shape for the correctness part only).

The production ``_state_output_kernel`` walks the chunks with two dependent dots a chunk on its critical path
(``v_new = u - w S``, then ``S <- e^c S + k^T D v_new``) and two output dots beside them. Variants timed here
(graph replay of the state pass alone, inputs from the production ``_prepare_kernel``):

* ``prod``: the kernel as it is; ``no_out``: without the output dots; ``no_ws``: no ``w S`` dot (one-dot chain,
  wrong values); ``loads``: the loads and the state's decay only (no dots).
* ``mform``: the same recurrence with one dot on the chain: ``S <- e^c S - M S + k^T (D u)`` with
  ``M = k^T D w`` [K, K] a chunk, and ``o = Q' S + O'`` with ``Q' = diag(qs) q - aqk w``, ``O' = aqk u``
  (all S-independent, built here by torch in fp32 and stored in bf16; a real build would make them in the
  solve kernel). Its output and final state are compared with the production kernel's and with the fp32
  reference.
* ``qprime``: the production chain with one output dot, ``o = Q' S + O'``; ``merged``: ``w S`` and ``Q' S`` as one
  [128, K] x [K, BV] dot (rows 64..127 of the state update's k tile zero, so no tile is split).

``--wrapper`` times the production wrapper instead (solve + state pass, fused output against the unfused state
kernel + parallel output kernel), graph-replayed.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from hyserve.kernels.gated_delta_rule import triton_prefill as tp
from hyserve.kernels.gated_delta_rule.reference import gated_delta_rule_prefill_reference

GPU = torch.cuda.is_available()


@triton.jit
def _chain_probe(
    q_ptr, k_ptr, w_ptr, u_ptr, cum_ptr, rk_ptr, aqk_ptr, qs_ptr, state_ptr, o_ptr, T, stride_t,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    DT: tl.constexpr, OUT: tl.constexpr, WS: tl.constexpr, KV: tl.constexpr,
):  # fmt: skip
    """_state_output_kernel for one sequence [0, T) with its dots switched by OUT / WS / KV."""
    i_hv = tl.program_id(0)
    i_v = tl.program_id(1)
    i_h = i_hv // G
    ok = tl.arange(0, K)
    ov = i_v * BV + tl.arange(0, BV)
    s_off = (i_hv * K + ok[:, None]) * V + ov[None, :]
    s = tl.load(state_ptr + s_off)
    rr = tl.arange(0, 64)
    n_chunks = T // 64
    for c in range(n_chunks):
        rows = (c * 64 + rr).to(tl.int64)
        w = tl.load(w_ptr + (rows[:, None] * HV + i_hv) * K + ok[None, :])
        u = tl.load(u_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :])
        k = tl.load(k_ptr + rows[:, None] * stride_t + i_h * K + ok[None, :])
        cum = tl.load(cum_ptr + rows * HV + i_hv)
        rk = tl.load(rk_ptr + rows * HV + i_hv)
        cum_last = tl.load(cum_ptr + (c * 64 + 63) * HV + i_hv)
        s_dt = s.to(DT)
        if WS:
            v_new = u.to(tl.float32) - tl.dot(w, s_dt)
        else:
            v_new = u.to(tl.float32) - w.to(tl.float32).sum(1)[:, None]
        if OUT:
            q = tl.load(q_ptr + rows[:, None] * stride_t + i_h * K + ok[None, :])
            aqk = tl.load(aqk_ptr + (rows[:, None] * HV + i_hv) * 64 + rr[None, :])
            qs = tl.load(qs_ptr + rows * HV + i_hv)
            o = tl.dot(q, s_dt) * qs[:, None]
            o += tl.dot(aqk, v_new.to(DT))
            tl.store(o_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], o.to(o_ptr.dtype.element_ty))
        v_scaled = v_new * (tl.exp(cum_last - cum) * rk)[:, None]
        if KV:
            s = s * tl.exp(cum_last) + tl.dot(tl.trans(k), v_scaled.to(DT))
        else:
            s = s * tl.exp(cum_last) + tl.sum(v_scaled, 0)[None, :] + tl.sum(k.to(tl.float32), 0)[:, None]
    tl.store(state_ptr + s_off, s)


@triton.jit
def _mform_kernel(
    q2_ptr, k_ptr, m_ptr, du_ptr, o2_ptr, cum_ptr, state_ptr, o_ptr, T, stride_t,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    DT: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    """One dot on the chain: S <- e^c S - M_c S + k^T Du; o = Q' S + O'."""
    i_hv = tl.program_id(0)
    i_v = tl.program_id(1)
    i_h = i_hv // G
    ok = tl.arange(0, K)
    ov = i_v * BV + tl.arange(0, BV)
    s_off = (i_hv * K + ok[:, None]) * V + ov[None, :]
    s = tl.load(state_ptr + s_off)
    rr = tl.arange(0, 64)
    n_chunks = T // 64
    for c in range(n_chunks):
        rows = (c * 64 + rr).to(tl.int64)
        m = tl.load(m_ptr + ((c * HV + i_hv) * K + ok[:, None]).to(tl.int64) * K + ok[None, :])
        k = tl.load(k_ptr + rows[:, None] * stride_t + i_h * K + ok[None, :])
        du = tl.load(du_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :])
        cum_last = tl.load(cum_ptr + (c * 64 + 63) * HV + i_hv)
        s_dt = s.to(DT)
        if OUT:
            q2 = tl.load(q2_ptr + (rows[:, None] * HV + i_hv) * K + ok[None, :])
            o2 = tl.load(o2_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :])
            o = tl.dot(q2, s_dt) + o2.to(tl.float32)
            tl.store(o_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], o.to(o_ptr.dtype.element_ty))
        kdu = tl.dot(tl.trans(k), du)
        s = s * tl.exp(cum_last) - tl.dot(m, s_dt) + kdu
    tl.store(state_ptr + s_off, s)


@triton.jit
def _qprime_kernel(
    q2_ptr, k_ptr, w_ptr, u_ptr, o2_ptr, cum_ptr, rk_ptr, state_ptr, o_ptr, T, stride_t,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    """The production chain, one output dot: o = Q' S + O' (Q' = diag(qs) q - aqk w, O' = aqk u)."""
    i_hv = tl.program_id(0)
    i_v = tl.program_id(1)
    i_h = i_hv // G
    ok = tl.arange(0, K)
    ov = i_v * BV + tl.arange(0, BV)
    s_off = (i_hv * K + ok[:, None]) * V + ov[None, :]
    s = tl.load(state_ptr + s_off)
    rr = tl.arange(0, 64)
    for c in range(T // 64):
        rows = (c * 64 + rr).to(tl.int64)
        w = tl.load(w_ptr + (rows[:, None] * HV + i_hv) * K + ok[None, :])
        u = tl.load(u_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :])
        k = tl.load(k_ptr + rows[:, None] * stride_t + i_h * K + ok[None, :])
        q2 = tl.load(q2_ptr + (rows[:, None] * HV + i_hv) * K + ok[None, :])
        o2 = tl.load(o2_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :])
        cum = tl.load(cum_ptr + rows * HV + i_hv)
        rk = tl.load(rk_ptr + rows * HV + i_hv)
        cum_last = tl.load(cum_ptr + (c * 64 + 63) * HV + i_hv)
        s_dt = s.to(DT)
        v_new = u.to(tl.float32) - tl.dot(w, s_dt)
        o = tl.dot(q2, s_dt) + o2.to(tl.float32)
        tl.store(o_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], o.to(o_ptr.dtype.element_ty))
        v_scaled = v_new * (tl.exp(cum_last - cum) * rk)[:, None]
        s = s * tl.exp(cum_last) + tl.dot(tl.trans(k), v_scaled.to(DT))
    tl.store(state_ptr + s_off, s)


@triton.jit
def _merged_kernel(
    wq_ptr, k_ptr, u_ptr, o2_ptr, cum_ptr, rk_ptr, state_ptr, o_ptr, T, stride_t,
    HV: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    """One [128, K] x [K, BV] dot a chunk for w S (rows < 64) and Q' S (rows >= 64); the state update's dot
    takes all 128 rows with k's rows >= 64 zero, so no tile is split."""
    i_hv = tl.program_id(0)
    i_v = tl.program_id(1)
    i_h = i_hv // G
    ok = tl.arange(0, K)
    ov = i_v * BV + tl.arange(0, BV)
    s_off = (i_hv * K + ok[:, None]) * V + ov[None, :]
    s = tl.load(state_ptr + s_off)
    r2 = tl.arange(0, 128)
    is_w = r2 < 64
    for c in range(T // 64):
        rows = (c * 64 + r2 % 64).to(tl.int64)
        wq = tl.load(wq_ptr + ((c * HV + i_hv) * 128 + r2[:, None]).to(tl.int64) * K + ok[None, :])
        u = tl.load(u_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], mask=is_w[:, None], other=0.0)
        o2 = tl.load(o2_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], mask=~is_w[:, None], other=0.0)
        k = tl.load(k_ptr + rows[:, None] * stride_t + i_h * K + ok[None, :], mask=is_w[:, None], other=0.0)
        cum = tl.load(cum_ptr + rows * HV + i_hv, mask=is_w, other=0.0)
        rk = tl.load(rk_ptr + rows * HV + i_hv, mask=is_w, other=0.0)
        cum_last = tl.load(cum_ptr + (c * 64 + 63) * HV + i_hv)
        r = tl.dot(wq, s.to(DT))  # [128, BV]
        tl.store(o_ptr + (rows[:, None] * HV + i_hv) * V + ov[None, :], (r + o2.to(tl.float32)).to(o_ptr.dtype.element_ty),
                 mask=~is_w[:, None])  # fmt: skip
        v_scaled = (u.to(tl.float32) - r) * (tl.exp(cum_last - cum) * rk)[:, None]
        s = s * tl.exp(cum_last) + tl.dot(tl.trans(k), v_scaled.to(DT))
    tl.store(state_ptr + s_off, s)


def inputs(t: int, h: int, hv: int, kd: int, dtype, device, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, 2 * h * kd + hv * kd, device=device, dtype=dtype, generator=gen)
    q = x[:, : h * kd].view(t, h, kd)
    k = x[:, h * kd : 2 * h * kd].view(t, h, kd)
    v = x[:, 2 * h * kd :].view(t, hv, kd)
    g = -torch.rand(t, hv, device=device, generator=gen) * 0.5
    beta = torch.rand(t, hv, device=device, generator=gen).to(dtype)
    state = torch.randn(1, hv, kd, kd, device=device, generator=gen) * 0.1
    return q, k, v, g, beta, state


def prepare(q, k, v, g, beta):
    """The production solve kernel's outputs (w, u, cum, rk, aqk, qs) for one sequence, and its launch."""
    t, h, kd = q.shape
    hv = v.shape[1]
    dev, dt = q.device, q.dtype
    cu = torch.tensor([0, t], device=dev, dtype=torch.int32)
    cum = torch.empty(t, hv, device=dev)
    rk = torch.empty(t, hv, device=dev)
    qs = torch.empty(t, hv, device=dev)
    w = torch.empty(t, hv, kd, device=dev, dtype=dt)
    u = torch.empty(t, hv, kd, device=dev, dtype=dt)
    aqk = torch.empty(t, hv, 64, device=dev, dtype=dt)
    prec = "ieee" if dt == torch.float32 else "tf32"

    def launch() -> None:
        tp._prepare_kernel[(t // 64 + 1, hv)](
            q, k, v, g, beta, cu, w, u, cum, rk, aqk, qs,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
            beta.stride(0), 1, kd**-0.5, HV=hv, G=hv // h, K=kd, V=kd, BK=kd, BV=kd, BN=64, DT=tp._TL_DTYPES[dt],
            PREC=prec, FUSED=True, num_warps=4,
        )  # fmt: skip

    launch()
    return (w, u, cum, rk, aqk, qs), launch


def mform_inputs(q, k, w, u, cum, rk, aqk, qs):
    """M [chunks, HV, K, K], Du [T, HV, V], Q' [T, HV, K], O' [T, HV, V] (model dtype), built in fp32."""
    t, h, kd = q.shape
    hv = w.shape[1]
    nc = t // 64
    kf = k.float().repeat_interleave(hv // h, 1).view(nc, 64, hv, kd)
    qf = q.float().repeat_interleave(hv // h, 1).view(nc, 64, hv, kd)
    wf, uf = w.float().view(nc, 64, hv, kd), u.float().view(nc, 64, hv, kd)
    c = cum.view(nc, 64, hv)
    d = torch.exp(c[:, -1:, :] - c) * rk.view(nc, 64, hv)  # [nc, 64, hv]
    m = torch.einsum("nrhk,nrhj->nhkj", kf, d[..., None] * wf)
    du = d[..., None] * uf
    a = aqk.float().view(nc, 64, hv, 64)
    q2 = qs.view(nc, 64, hv)[..., None] * qf - torch.einsum("nrhs,nshk->nrhk", a, wf)
    o2 = torch.einsum("nrhs,nshv->nrhv", a, uf)
    dt = q.dtype
    return (m.to(dt).contiguous(), du.reshape(t, hv, kd).to(dt), q2.reshape(t, hv, kd).to(dt),
            o2.reshape(t, hv, kd).to(dt))  # fmt: skip


VARIANTS = {}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(t: int, dtype, bvs=(16, 32, 64)) -> list[str]:
    dev = "cuda" if GPU else "cpu"
    h, hv, kd = (16, 32, 128) if GPU else (2, 4, 32)
    q, k, v, g, beta, state0 = inputs(t, h, hv, kd, dtype, dev)
    dt = tp._TL_DTYPES[dtype]
    (w, u, cum, rk, aqk, qs), solve = prepare(q, k, v, g, beta)
    m, du, q2, o2 = mform_inputs(q, k, w, u, cum, rk, aqk, qs)
    cu = torch.tensor([0, t], device=dev, dtype=torch.int32)
    idx = torch.zeros(1, dtype=torch.long, device=dev)
    init = torch.ones(1, dtype=torch.bool, device=dev)
    lines = []
    print(f"T={t}: inputs ready", flush=True)

    # correctness: production wrapper, the fp32 reference, the M form
    s_prod = state0.clone()
    o_prod = tp.gated_delta_rule_prefill_triton(q, k, v, g, beta, s_prod, cu, idx, init)
    if t <= 1024:
        s_ref = state0.clone()
        o_ref = gated_delta_rule_prefill_reference(
            q.float(), k.float(), v.float(), g, beta.float(), s_ref, cu, idx, init
        )
    else:
        o_ref, s_ref = o_prod, s_prod
    s_m = state0[0].clone()
    o_m = torch.empty(t, hv, kd, device=dev, dtype=dtype)
    _mform_kernel[(hv, kd // 32)](q2, k, m, du, o2, cum, s_m, o_m, t, q.stride(0), HV=hv, G=hv // h, K=kd, V=kd, BV=32, DT=dt,
                                  OUT=True, num_warps=4)  # fmt: skip
    lines.append(
        f"T={t}: o rel err vs fp32 ref: prod {rel(o_prod, o_ref):.2e} mform {rel(o_m, o_ref):.2e} "
        f"(mform vs prod {rel(o_m, o_prod):.2e}); state: prod {rel(s_prod, s_ref):.2e} "
        f"mform {rel(s_m, s_ref[0]):.2e}"
    )
    print(lines[-1], flush=True)
    nc = t // 64
    wq = torch.cat([w.view(nc, 64, hv, kd), q2.view(nc, 64, hv, kd)], 1).permute(0, 2, 1, 3).contiguous()
    for name, launch in (
        ("qprime", lambda s_, o_, bv, nw, ns: _qprime_kernel[(hv, kd // bv)](
            q2, k, w, u, o2, cum, rk, s_, o_, t, q.stride(0), HV=hv, G=hv // h, K=kd, V=kd, BV=bv, DT=dt,
            num_warps=nw, num_stages=ns)),
        ("merged", lambda s_, o_, bv, nw, ns: _merged_kernel[(hv, kd // bv)](
            wq, k, u, o2, cum, rk, s_, o_, t, q.stride(0), HV=hv, G=hv // h, K=kd, V=kd, BV=bv, DT=dt,
            num_warps=nw, num_stages=ns)),
    ):  # fmt: skip
        s_x = state0[0].clone()
        o_x = torch.empty(t, hv, kd, device=dev, dtype=dtype)
        launch(s_x, o_x, 32, 4, 2)
        lines.append(f"T={t}: {name}: o rel err vs ref {rel(o_x, o_ref):.2e} vs prod {rel(o_x, o_prod):.2e}; "
                     f"state vs ref {rel(s_x, s_ref[0]):.2e}")  # fmt: skip
        print(lines[-1], flush=True)
        VARIANTS[name] = launch
    if not GPU:
        return lines
    import triton.testing as tt

    def timed(fn) -> float:
        try:
            return tt.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
        except triton.runtime.errors.OutOfResources:
            return float("nan")

    s = state0[0].clone()
    o = torch.empty(t, hv, kd, device=dev, dtype=dtype)
    lines.append(f"T={t}: prepare {timed(solve):.1f} us (production solve)")
    for bv in bvs:
        for nw, ns in ((4, 2), (4, 3), (8, 2)):
            cells = []
            for name, flags in (
                ("prod", (1, 1, 1)),
                ("no_out", (0, 1, 1)),
                ("no_ws", (0, 0, 1)),
                ("loads", (0, 0, 0)),
            ):
                fn = lambda f=flags, bv=bv, nw=nw, ns=ns: _chain_probe[(hv, kd // bv)](  # noqa: E731
                    q, k, w, u, cum, rk, aqk, qs, s, o, t, q.stride(0), HV=hv, G=hv // h, K=kd, V=kd, BV=bv, DT=dt,
                    OUT=f[0], WS=f[1], KV=f[2], num_warps=nw, num_stages=ns)  # fmt: skip
                cells.append(f"{name} {timed(fn):6.1f}")
            for name, launch in VARIANTS.items():
                cells.append(
                    f"{name} {timed(lambda launch=launch, bv=bv, nw=nw, ns=ns: launch(s, o, bv, nw, ns)):6.1f}"
                )
            for out in (1, 0):
                fn = lambda out=out, bv=bv, nw=nw, ns=ns: _mform_kernel[(hv, kd // bv)](  # noqa: E731
                    q2, k, m, du, o2, cum, s, o, t, q.stride(0), HV=hv, G=hv // h, K=kd, V=kd, BV=bv, DT=dt, OUT=out,
                    num_warps=nw, num_stages=ns)  # fmt: skip
                cells.append(f"mform{'' if out else '_no_out'} {timed(fn):6.1f}")
            lines.append(f"T={t} BV={bv:3d} warps={nw} stages={ns}: " + "  ".join(cells) + " us")
            print(lines[-1], flush=True)
    return lines


WRAPPER_CONFIGS = [{}] + [
    {
        "fused_output": False,
        "state": {"BV": sbv, "num_warps": 4, "num_stages": ns},
        "output": {"BV": obv, "num_warps": ow},
    }
    for sbv in (32, 64)
    for ns in (2, 3)
    for obv in (64, 128)
    for ow in (4, 8)
]


def run_wrapper(t: int) -> None:
    """The whole production wrapper (solve + state pass [+ output]) per config, graph-replayed."""
    import triton.testing as tt

    q, k, v, g, beta, state0 = inputs(t, 16, 32, 128, torch.bfloat16, "cuda")
    cu = torch.tensor([0, t], device="cuda", dtype=torch.int32)
    idx = torch.zeros(1, dtype=torch.long, device="cuda")
    init = torch.ones(1, dtype=torch.bool, device="cuda")
    base = tp.gated_delta_rule_prefill_triton(q, k, v, g, beta, state0.clone(), cu, idx, init)
    for cfg in WRAPPER_CONFIGS:
        s = state0.clone()
        o = tp.gated_delta_rule_prefill_triton(q, k, v, g, beta, s, cu, idx, init, configs=cfg)
        try:
            us = 1e3 * tt.do_bench_cudagraph(
                lambda cfg=cfg, s=s: tp.gated_delta_rule_prefill_triton(
                    q, k, v, g, beta, s, cu, idx, init, configs=cfg
                ),
                rep=50,
                return_mode="median",
            )
        except triton.runtime.errors.OutOfResources:
            us = float("nan")
        print(
            f"T={t} wrapper {us:6.1f} us  (o vs default {rel(o, base):.1e})  {cfg or 'default'}", flush=True
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lens", default="1024,4096" if GPU else "128")
    parser.add_argument("--wrapper", action="store_true", help="time the production wrapper's configs only")
    args = parser.parse_args()
    dtype = torch.bfloat16 if GPU else torch.float32
    for t in (int(x) for x in args.lens.split(",")):
        if args.wrapper:
            run_wrapper(t)
        else:
            run(t, dtype)


if __name__ == "__main__":
    main()
