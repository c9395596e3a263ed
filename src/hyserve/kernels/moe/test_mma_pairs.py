"""mma_pairs: the experts' fragment-ordered copy gives back every gate_up bit; its reference is the Triton pairs
kernel's math (with the unfused path's rounding of the normed x); on the GPU the CUDA gate_up against it at the
model's shapes, NaN-poisoned, every SPLIT, PDL on and off, and against the Triton kernel."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.moe.mma_pairs import (
    gate_up_mma,
    gate_up_mma_reference,
    pack_mma_experts,
    unpack_mma_experts,
)
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _experts(e: int, inter: int, hidden: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(e, 2 * inter, hidden, generator=gen) * hidden**-0.5).bfloat16()
    shared = (torch.randn(2 * inter, hidden, generator=gen) * hidden**-0.5).bfloat16()
    w[1, 3, :9] = 0.0  # escapes
    sg = (torch.randn(1, hidden, generator=gen) * hidden**-0.5).bfloat16()
    return w.to(DEVICE), shared.to(DEVICE), sg.to(DEVICE)


def test_round_trip_is_bit_exact():
    w, shared, _ = _experts(4, 32, 128)
    packed = pack_mma_experts(w, shared)
    w2, shared2 = unpack_mma_experts(packed)
    assert torch.equal(w2.view(torch.int16), w.view(torch.int16))
    assert torch.equal(shared2.view(torch.int16), shared.view(torch.int16))
    assert packed.num_experts == 4 and packed.inter == 32


def test_pack_rejects_bad_shapes():
    w, shared, _ = _experts(2, 32, 128)
    with pytest.raises(ValueError):
        pack_mma_experts(w, shared[:32])
    with pytest.raises(ValueError):
        pack_mma_experts(w.float(), shared)


def test_reference_is_the_moe_math():
    """h = w silu(x_n W_g^T) (x_n W_u^T): the routed pairs' weights the softmax of the scaled top-k logits, the
    shared expert's its sigmoid gate, against a direct float64 computation on the unpacked weights."""
    w, shared, sg = _experts(6, 32, 128, seed=2)
    packed = pack_mma_experts(w, shared)
    x = torch.randn(1, 128, device=DEVICE).bfloat16()
    nw = (torch.randn(128, device=DEVICE) * 0.1).bfloat16()
    ids = torch.tensor([[4, 1, 5]], dtype=torch.int32, device=DEVICE)
    raw = torch.tensor([[2.0, 1.5, -0.5]], device=DEVICE)
    h = gate_up_mma_reference(x, packed, ids, raw, nw, 1e-6, sg)
    xd = x.double()
    rstd = (xd.pow(2).mean() + 1e-6).rsqrt()
    xn = (xd * rstd * (1 + nw.double())).bfloat16().double()[0]
    p = torch.softmax((raw.double()[0] * rstd).bfloat16().double(), 0)
    for row, (e, wt) in enumerate(list(zip(ids[0].tolist(), p.tolist())) + [(None, None)]):
        m = (shared if e is None else w[e]).double()
        wt = torch.sigmoid(xn @ sg.double()[0]).item() if e is None else wt
        gu = m @ xn
        want = torch.nn.functional.silu(gu[:32]) * gu[32:] * wt
        assert rel_err(h[row].float(), want) < 1e-2, row


gpu = pytest.mark.skipif(
    not CUDA, reason="the CUDA kernel runs on the GPU only (the CPU tests check its layout)"
)


@gpu
@pytest.mark.parametrize("split", [2, 4, 8])
@pytest.mark.parametrize("pdl", ["0", "1"])
@pytest.mark.parametrize("gate", [True, False])
def test_kernel_matches_reference(monkeypatch, split, pdl, gate):
    monkeypatch.setenv("HYSERVE_PDL", pdl)
    w, shared, sg = _experts(256, 512, 2048, seed=split)
    packed = pack_mma_experts(w, shared)
    x = (torch.randn(1, 2048, device=DEVICE) * 2).bfloat16()
    nw = (torch.randn(2048, device=DEVICE) * 0.1).bfloat16()
    ids = torch.randperm(256, device=DEVICE)[:8].int()[None].contiguous()
    ids[0, 0] = 1  # the expert with escapes
    raw = torch.randn(1, 8, device=DEVICE).sort(descending=True).values.contiguous()
    out = torch.full((9, 512), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    h = gate_up_mma(x, packed, ids, raw, nw, 1e-6, sg if gate else None, split=split, out=out)
    ref = gate_up_mma_reference(x, packed, ids, raw, nw, 1e-6, sg if gate else None)
    assert not h.isnan().any()
    for row in range(9):
        assert rel_err(h[row].float(), ref[row].float()) < 1e-2, row


@gpu
def test_kernel_matches_the_triton_pairs_kernel():
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.triton_pairs import gate_up_pairs

    w, shared, sg = _experts(256, 512, 2048, seed=9)
    packed = pack_mma_experts(w, shared)
    x = (torch.randn(1, 2048, device=DEVICE) * 2).bfloat16()
    nw = (torch.randn(2048, device=DEVICE) * 0.1).bfloat16()
    ids = torch.randperm(256, device=DEVICE)[:8].int()[None].contiguous()
    raw = torch.randn(1, 8, device=DEVICE).sort(descending=True).values.contiguous()
    plan = get_plan(1, 256, 2048, 512, 8, torch.bfloat16)["gate_up"]
    triton = gate_up_pairs(x, w, shared, sg, ids, raw, plan, norm_weight=nw, norm_eps=1e-6)
    mma = gate_up_mma(x, packed, ids, raw, nw, 1e-6, sg)
    # the Triton kernel keeps the normed x in fp32, this one rounds it to bf16 as the unfused path does
    assert rel_err(mma.float(), triton.float()) < 1e-2
