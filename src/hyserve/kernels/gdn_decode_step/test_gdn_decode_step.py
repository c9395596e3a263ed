"""gdn_decode_step: the reference vs a float64 formula; the fused Triton kernel vs the reference.

The fused kernel hands the q/k conv-state write and (BV < V) the norm between programs with tickets;
the interpreter runs programs one by one, so on the CPU this checks the arithmetic and the tickets'
bookkeeping, and on the GPU (real shapes, many steps in a row) also the ordering.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hyserve.kernels.gdn_decode_step import triton_kernel
from hyserve.kernels.gdn_decode_step.reference import gdn_decode_step_reference
from hyserve.kernels.gdn_decode_step.triton_kernel import _workspace, gdn_decode_step_triton
from hyserve.kernels.testing import rel_err

_triton = gdn_decode_step_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}
# the fp32 state sees the conv output after rounding to the model dtype: a rare flipped rounding moves it a bit
STATE_TOL = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def _inputs(h, hv, kd, vd, batch, dtype, width=4, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    d = 2 * h * kd + hv * vd
    num_slots = batch + 3

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(dtype).to(device)

    # views of one projection output [B, D + HV*V + 2*HV], as the model's fused in_proj gives them
    proj = rnd(batch, d + hv * vd + 2 * hv)
    x, z, b, a = proj.split([d, hv * vd, hv, hv], dim=-1)
    z = z.view(batch, hv, vd)
    conv_w = rnd(d, width, scale=width**-0.5)
    a_log = torch.empty(hv).uniform_(1.0, 16.0, generator=gen).log().to(dtype).to(device)
    dt_bias = torch.empty(hv).uniform_(0.5, 1.5, generator=gen).to(dtype).to(device)
    norm_w = (1 + 0.05 * torch.randn(vd, generator=gen)).to(dtype).to(device)
    conv_state = rnd(num_slots, width - 1, d)
    ssm_state = (0.3 * torch.randn(num_slots, hv, kd, vd, generator=gen)).to(device)
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(device)
    return x, z, a, b, conv_w, a_log, dt_bias, norm_w, 1e-6, conv_state, ssm_state, slots


def test_reference_matches_formula():
    h, hv, kd, vd = 2, 4, 8, 12
    args = _inputs(h, hv, kd, vd, 3, torch.float32, device="cpu")
    x, z, a, b, cw, a_log, dt_bias, nw, eps, cs, ss, slots = args
    d = x.shape[1]
    cs0, ss0 = cs.clone(), ss.clone()
    got = gdn_decode_step_reference(*args)
    x, z, a, b, cw, a_log, dt_bias, nw, cs0, ss0 = (
        t.double() for t in (x, z, a, b, cw, a_log, dt_bias, nw, cs0, ss0)
    )
    for i, slot in enumerate(slots.tolist()):
        window = torch.cat([cs0[slot], x[i : i + 1]])  # [W, D]
        y = (window * cw.t()).sum(0)
        y = y * torch.sigmoid(y)
        assert torch.allclose(cs[slot].double(), window[1:])
        q, k, v = y[: h * kd].view(h, kd), y[h * kd : 2 * h * kd].view(h, kd), y[2 * h * kd :].view(hv, vd)
        for j in range(hv):
            qj = q[j // (hv // h)] / torch.sqrt((q[j // (hv // h)] ** 2).sum() + 1e-6) * kd**-0.5
            kj = k[j // (hv // h)] / torch.sqrt((k[j // (hv // h)] ** 2).sum() + 1e-6)
            g = -torch.exp(a_log[j]) * F.softplus(a[i, j] + dt_bias[j])
            s = ss0[slot, j] * torch.exp(g)
            s = s + torch.outer(kj, (v[j] - s.t() @ kj) * torch.sigmoid(b[i, j]))
            assert rel_err(ss[slot, j], s) < 1e-6
            o = s.t() @ qj
            o = nw * o / torch.sqrt((o**2).mean() + eps) * z[i, j] * torch.sigmoid(z[i, j])
            assert rel_err(got[i, j], o) < 1e-5
    assert d == cs.shape[-1]


CASES = [
    (2, 4, 16, 24, 3, torch.float32, None),  # BV = V: norm in the program; small batch: early loads
    (2, 4, 16, 24, 5, torch.float32, None),  # BV = V past _EARLY_MAX_BATCH: state and gates after the conv
    (2, 4, 16, 24, 3, torch.float32, 8),  # three V tiles: ticketed norm
    (2, 2, 32, 32, 2, torch.float16, 16),
    (1, 1, 16, 16, 1, torch.float32, None),  # one program per key head and sequence: no tickets at all
]
if CUDA:
    CASES += [(16, 32, 128, 128, b, torch.bfloat16, bv) for b in (1, 4, 32, 65) for bv in (None, 32, 64, 128)]


@pytest.mark.parametrize("h,hv,kd,vd,batch,dtype,block_v", CASES)
def test_triton_matches_reference(h, hv, kd, vd, batch, dtype, block_v):
    args = list(_inputs(h, hv, kd, vd, batch, dtype))
    cs, ss, slots = args[9], args[10], args[11]
    cs_ref, ss_ref, cs_tri, ss_tri = cs.clone(), ss.clone(), cs.clone(), ss.clone()
    want = gdn_decode_step_reference(*args[:9], cs_ref, ss_ref, slots)
    out = torch.full_like(want, float("nan"))
    gdn_decode_step_triton(*args[:9], cs_tri, ss_tri, slots, block_v=block_v, out=out)
    assert not out.isnan().any()
    assert rel_err(out, want) < TOL[dtype]
    assert torch.equal(cs_tri, cs_ref)  # conv state: copies of inputs, exact
    assert rel_err(ss_tri[slots], ss_ref[slots]) < STATE_TOL[dtype]
    unused = torch.ones(ss.shape[0], dtype=torch.bool, device=ss.device)
    unused[slots] = False
    assert torch.equal(ss_tri[unused], ss[unused]) and torch.equal(cs_tri[unused], cs[unused])
    assert not _workspace(out.device, 0).any()  # every ticket counter back to zero


@pytest.mark.parametrize("block_v,early", [(8, False), (None, True), (None, False)])
def test_early_loads_either_way(block_v, early):
    """``early`` (state, conv windows and gates before the PDL wait) on and off, split and whole-head tiles: the
    same numbers and the same conv state."""
    args = list(_inputs(2, 4, 16, 24, 2, torch.float32, seed=7))
    cs, ss, slots = args[9], args[10], args[11]
    cs_ref, ss_ref, cs_tri, ss_tri = cs.clone(), ss.clone(), cs.clone(), ss.clone()
    want = gdn_decode_step_reference(*args[:9], cs_ref, ss_ref, slots)
    got = gdn_decode_step_triton(*args[:9], cs_tri, ss_tri, slots, block_v=block_v, early=early)
    assert rel_err(got, want) < TOL[torch.float32]
    assert torch.equal(cs_tri, cs_ref)
    assert rel_err(ss_tri[slots], ss_ref[slots]) < STATE_TOL[torch.float32]
    assert not _workspace(got.device, 0).any()


@pytest.mark.parametrize("width", [2, 3])
def test_other_conv_widths(width):
    """Small V tiles load a width-4 conv's taps and state rows before the PDL wait; other widths take the
    one-tap-at-a-time loop."""
    args = list(_inputs(2, 4, 16, 24, 2, torch.float32, width=width, seed=width))
    cs, ss, slots = args[9], args[10], args[11]
    cs_ref, ss_ref, cs_tri, ss_tri = cs.clone(), ss.clone(), cs.clone(), ss.clone()
    want = gdn_decode_step_reference(*args[:9], cs_ref, ss_ref, slots)
    got = gdn_decode_step_triton(*args[:9], cs_tri, ss_tri, slots, block_v=8)
    assert rel_err(got, want) < TOL[torch.float32]
    assert torch.equal(cs_tri, cs_ref)


@pytest.mark.parametrize("block_v", [None, 8])
def test_many_steps(block_v):
    """Steps fed back into the same state pools (GPU: real shapes, races would show as drift)."""
    shape = (16, 32, 128, 128, 8, torch.bfloat16, 10) if CUDA else (2, 4, 16, 24, 2, torch.float32, 3)
    h, hv, kd, vd, batch, dtype, steps = shape
    args = list(_inputs(h, hv, kd, vd, batch, dtype))
    cs_ref, ss_ref = args[9].clone(), args[10].clone()
    cs_tri, ss_tri = args[9].clone(), args[10].clone()
    for step in range(steps):
        fresh = _inputs(h, hv, kd, vd, batch, dtype, seed=step + 1)
        args[:4] = fresh[:4]
        want = gdn_decode_step_reference(*args[:9], cs_ref, ss_ref, args[11])
        got = gdn_decode_step_triton(*args[:9], cs_tri, ss_tri, args[11], block_v=block_v)
        assert rel_err(got, want) < TOL[dtype], step
    assert torch.equal(cs_tri, cs_ref)
    assert rel_err(ss_tri, ss_ref) < 10 * STATE_TOL[dtype]


def test_dispatch(monkeypatch):
    from hyserve.kernels import gdn_decode_step  # the package exports the op under its folder's name

    calls = []
    monkeypatch.setattr(triton_kernel, "gdn_decode_step_triton", lambda *a: calls.append(1) or _triton(*a))
    args = _inputs(2, 4, 16, 16, 2, torch.float32)
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    a1 = [t.clone() if isinstance(t, torch.Tensor) else t for t in args]
    a2 = [t.clone() if isinstance(t, torch.Tensor) else t for t in args]
    assert rel_err(gdn_decode_step(*a1), gdn_decode_step_reference(*a2)) < 1e-5
    assert calls == [1]


def test_counters_are_never_allocated_inside_a_capture(monkeypatch):
    """Counters allocated while capturing would live in the graphs' shared pool (overwritten between replays)."""
    from hyserve.kernels import tickets

    monkeypatch.setattr(tickets, "_COUNTERS", {})
    cpu = torch.device("cpu")
    assert _workspace(cpu, 10) is _workspace(cpu, 100)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="before CUDA-graph capture"):
        _workspace(torch.device("cuda", 0), 10)
