"""gated_delta_rule prefill/decode: references vs a float64 per-token loop; Triton vs the references.

CPU: the Triton kernels run in the interpreter on tiny shapes (fp32, fp16). GPU: also the model's shapes
(H=16, HV=32, K=V=128, bf16) with q/k/v as views of one [T, 2*H*K + HV*V] tensor, as the model passes them.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hyserve.kernels.gated_delta_rule import triton_prefill
from hyserve.kernels.gated_delta_rule.reference import (
    gated_delta_rule_decode_reference,
    gated_delta_rule_prefill_reference,
)
from hyserve.kernels.gated_delta_rule.triton_decode import gated_delta_rule_decode_triton
from hyserve.kernels.gated_delta_rule.triton_prefill import gated_delta_rule_prefill_triton
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _naive(q, k, v, g, beta, state, cu_seqlens, state_indices, has_initial_state):
    """float64 per-token recurrence; returns (o [T, HV, V], final state of each sequence [HV, K, V])."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    group = v.shape[1] // q.shape[1]
    scale = q.shape[-1] ** -0.5
    out = torch.zeros_like(v)
    finals = []
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_indices.tolist()):
        s = (
            state[slot].double().clone()
            if bool(has_initial_state[i])
            else torch.zeros_like(state[slot]).double()
        )
        for t in range(bounds[i], bounds[i + 1]):
            for hv in range(v.shape[1]):
                kt, qt = k[t, hv // group], q[t, hv // group]
                kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
                qt = qt / torch.sqrt((qt * qt).sum() + 1e-6) * scale
                s[hv] = s[hv] * torch.exp(g[t, hv])
                delta = (v[t, hv] - s[hv].t() @ kt) * beta[t, hv]
                s[hv] = s[hv] + torch.outer(kt, delta)
                out[t, hv] = s[hv].t() @ qt
        finals.append(s)
    return out, finals


def _inputs(h, hv, kd, vd, lens, dtype, seed=0, device=DEVICE):
    """q/k/v as views of one packed [T, 2*H*K + HV*V] tensor (the conv output), decays in the model's range.

    Slots no sequence uses hold random values (checked untouched); the slots of sequences without an
    initial state hold NaN (they must not be read)."""
    gen = torch.Generator().manual_seed(seed)
    t, n = sum(lens), len(lens)
    mixed = torch.randn(t, 2 * h * kd + hv * vd, generator=gen).to(dtype).to(device)
    q = mixed[:, : h * kd].view(t, h, kd)
    k = mixed[:, h * kd : 2 * h * kd].view(t, h, kd)
    v = mixed[:, 2 * h * kd :].view(t, hv, vd)
    a = torch.randn(t, hv, generator=gen)
    g = -torch.empty(hv).uniform_(1.0, 16.0, generator=gen) * F.softplus(a - 4.0)  # log-decay <= 0, fp32
    beta = torch.sigmoid(torch.randn(t, hv, generator=gen)).to(dtype)
    num_slots = n + 3
    state = torch.randn(num_slots, hv, kd, vd, generator=gen) * 0.3
    slots = torch.randperm(num_slots, generator=gen)[:n]
    has_init = torch.tensor([i % 3 != 1 for i in range(n)])
    state[slots[~has_init]] = float("nan")
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    rest = (g, beta, state, cu, slots, has_init)
    return (q, k, v, *(x.to(device) for x in rest))


def _check_untouched(before, after, used):
    """Slots outside ``used`` are bit-identical (NaN included)."""
    mask = torch.ones(before.shape[0], dtype=torch.bool, device=before.device)
    mask[used.to(before.device)] = False
    assert torch.equal(before[mask].view(torch.int32), after[mask].view(torch.int32))


# ---------------------------------------------------------------- references vs float64


@pytest.mark.parametrize("h,hv,kd,vd", [(2, 4, 16, 24), (2, 2, 32, 32)])
def test_prefill_reference_matches_naive(h, hv, kd, vd):
    args = _inputs(h, hv, kd, vd, [1, 70, 130, 5], torch.float32, device="cpu")
    q, k, v, g, beta, state, cu, idx, init = args
    clean = torch.nan_to_num(state, nan=0.0)
    want_o, want_s = _naive(q, k, v, g, beta, clean, cu, idx, init)
    s = state.clone()
    o = gated_delta_rule_prefill_reference(q, k, v, g, beta, s, cu, idx, init)
    assert rel_err(o, want_o) < 1e-5
    for i, slot in enumerate(idx.tolist()):
        assert rel_err(s[slot], want_s[i]) < 1e-5
    _check_untouched(state, s, idx)


def test_decode_reference_matches_naive():
    q, k, v, g, beta, state, _, idx, _ = _inputs(2, 4, 16, 24, [1, 1, 1], torch.float32, device="cpu")
    state = torch.nan_to_num(state, nan=0.5)
    cu = torch.arange(4, dtype=torch.int32)
    want_o, want_s = _naive(q, k, v, g, beta, state, cu, idx, torch.ones(3, dtype=torch.bool))
    s = state.clone()
    o = gated_delta_rule_decode_reference(q, k, v, g, beta, s, idx)
    assert rel_err(o, want_o) < 1e-6
    for i, slot in enumerate(idx.tolist()):
        assert rel_err(s[slot], want_s[i]) < 1e-6
    _check_untouched(state, s, idx)


# ---------------------------------------------------------------- Triton vs references

# (H, HV, K, V, sequence lengths, dtype, fused): fused = the output inside the state loop (2 launches)
PREFILL = [
    (2, 4, 16, 24, [1, 70, 5], torch.float32, True),
    (2, 4, 16, 24, [1, 70, 5], torch.float32, False),
    (2, 2, 32, 32, [64, 0, 3], torch.float32, True),
    (2, 4, 16, 32, [90, 1], torch.float16, True),
]
if CUDA:
    PREFILL += [
        (16, 32, 128, 128, [1, 100, 1000, 192, 63], torch.bfloat16, True),
        (16, 32, 128, 128, [1, 100, 1000, 192, 63], torch.bfloat16, False),
        (16, 32, 128, 128, [4096], torch.bfloat16, True),
        (2, 4, 16, 24, [1, 70, 130, 5], torch.bfloat16, False),
        (2, 2, 32, 32, [64, 0, 3], torch.float32, False),
    ]


@pytest.mark.parametrize("h,hv,kd,vd,lens,dtype,fused", PREFILL)
def test_prefill_triton_matches_reference(h, hv, kd, vd, lens, dtype, fused, monkeypatch):
    monkeypatch.setattr(triton_prefill, "POISON_SCRATCH", True)
    q, k, v, g, beta, state, cu, idx, init = _inputs(h, hv, kd, vd, lens, dtype)
    s_ref, s_tri = state.clone(), state.clone()
    want = gated_delta_rule_prefill_reference(q, k, v, g, beta, s_ref, cu, idx, init)
    out = torch.full_like(want, float("nan"))
    cfg = {"fused_output": fused}
    got = gated_delta_rule_prefill_triton(q, k, v, g, beta, s_tri, cu, idx, init, configs=cfg, out=out)
    assert got is out and not out.isnan().any()
    assert rel_err(out, want) < TOL[dtype]
    used = torch.tensor([s for s, n in zip(idx.tolist(), lens) if n > 0], dtype=torch.long)
    assert rel_err(s_tri[used.to(DEVICE)], s_ref[used.to(DEVICE)]) < TOL[dtype]
    _check_untouched(state, s_tri, used)


DECODE = [(2, 4, 16, 24, 3, torch.float32, None), (2, 2, 32, 32, 2, torch.float16, 16)]
DECODE += [(2, 4, 16, 24, 1, torch.float32, 8)]
if CUDA:
    DECODE += [(16, 32, 128, 128, b, torch.bfloat16, bv) for b in (1, 8, 33) for bv in (None, 32, 128)]


@pytest.mark.parametrize("h,hv,kd,vd,batch,dtype,block_v", DECODE)
def test_decode_triton_matches_reference(h, hv, kd, vd, batch, dtype, block_v):
    q, k, v, g, beta, state, _, idx, _ = _inputs(h, hv, kd, vd, [1] * batch, dtype)
    state = torch.nan_to_num(state, nan=0.25)
    s_ref, s_tri = state.clone(), state.clone()
    want = gated_delta_rule_decode_reference(q, k, v, g, beta, s_ref, idx)
    out = torch.full_like(want, float("nan"))
    gated_delta_rule_decode_triton(q, k, v, g, beta, s_tri, idx, block_v=block_v, out=out)
    assert not out.isnan().any()
    assert rel_err(out, want) < TOL[dtype]
    assert rel_err(s_tri[idx], s_ref[idx]) < 1e-5  # the state update itself is fp32
    _check_untouched(state, s_tri, idx)


def test_dispatch_uses_triton(monkeypatch):
    import hyserve.kernels.gated_delta_rule as op

    calls = []
    real = triton_prefill.gated_delta_rule_prefill_triton
    monkeypatch.setattr(
        triton_prefill, "gated_delta_rule_prefill_triton", lambda *a: calls.append(1) or real(*a)
    )
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    q, k, v, g, beta, state, cu, idx, init = _inputs(2, 2, 16, 16, [3, 1], torch.float32)
    s_ref, s_tri = state.clone(), state.clone()
    want = gated_delta_rule_prefill_reference(q, k, v, g, beta, s_ref, cu, idx, init)
    assert rel_err(op.gated_delta_rule_prefill(q, k, v, g, beta, s_tri, cu, idx, init), want) < 1e-5
    assert calls == [1]
    monkeypatch.setenv("HYSERVE_KERNELS", "reference")
    op.gated_delta_rule_prefill(q, k, v, g, beta, s_tri, cu, idx, init)
    assert calls == [1]
