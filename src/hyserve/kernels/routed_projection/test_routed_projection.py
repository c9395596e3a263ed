"""routed_projection: the linearity it rests on (the references against the router they replace), and the Triton
paths against the references: the in-projection's raw rows through the GEMV, and the routing out-projection (h1
bit for bit the GEMV's, the same experts, weights and xn within rounding), NaN-poisoned outputs. The CPU runs the
kernels in the Triton interpreter at small shapes; a GPU also at the model's (H 2048, Hv 4096, E 256, k 8)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.linear.triton_kernel import gemv_triton
from hyserve.kernels.moe.test_moe import pairs_plan, rel_err
from hyserve.kernels.routed_projection import (
    build_router_rows,
    project_in_reference,
    project_out_route_reference,
    router_reference,
)
from hyserve.kernels.routed_projection.triton_kernel import project_out_route_triton
from hyserve.kernels.tickets import ticket_counters

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


class Layer:
    """A random layer's tensors: h0 [1, H], a [1, Hv], the in-projection [n_in, H], W_o [H, Hv], the router
    [E, H] and its pre-norm weight [H]; with the extended weights ``build_router_rows`` gives."""

    def __init__(self, H, Hv, n_in, E, dtype, seed=0, device=DEVICE):
        gen = torch.Generator().manual_seed(seed)

        def rnd(*shape, scale=1.0):
            return (scale * torch.randn(*shape, generator=gen)).to(dtype).to(device)

        self.h0, self.a = rnd(1, H, scale=3.0), rnd(1, Hv)
        self.w_in, self.w_o = rnd(n_in, H, scale=H**-0.5), rnd(H, Hv, scale=Hv**-0.5)
        self.router, self.g_in, self.g = rnd(E, H, scale=H**-0.5), rnd(H, scale=0.3), rnd(H, scale=0.3)
        wr, m = build_router_rows(self.router, self.g, self.w_o)
        self.w_in_ext = torch.cat([self.w_in, wr])
        self.w_o_ext = torch.cat([m, self.w_o])  # M's rows first (triton_kernel.py)
        self.H, self.n_in, self.E = H, n_in, E


def _routed_weights(h1, top, norm_eps):
    """The weights the experts take from the raw top-k logits (``moe`` with ``routing``): fp32, no rounding."""
    rstd = torch.rsqrt(h1.float().pow(2).mean(-1, keepdim=True) + norm_eps)
    return torch.softmax(top * rstd, dim=-1)


def test_linearity_matches_the_router():
    """fp32, no rounding in the way: the routed projections route exactly as the router after the residual add."""
    lay = Layer(64, 96, 40, 16, torch.float32, device="cpu")
    for seed in range(5):
        lay.h0 = torch.randn(1, 64, generator=torch.Generator().manual_seed(seed)) * 3
        y = project_in_reference(lay.h0, lay.w_in_ext, lay.n_in, lay.g_in, 1e-6)
        h = lay.h0.clone()
        ids, top = project_out_route_reference(lay.a, lay.w_o_ext, h, y[:, lay.n_in :], 4)
        ref_ids, ref_w = router_reference(h, lay.router, lay.g, 1e-6, 4)
        assert torch.equal(ids, ref_ids)
        assert rel_err(_routed_weights(h, top, 1e-6), ref_w) < 1e-5


CASES = [
    # H, Hv, n_in, E, top_k, dtype, in plan, out plan
    (
        64,
        128,
        96,
        16,
        4,
        torch.float32,
        dict(BLOCK_N=4, BLOCK_K=64, BCAST_X=1),
        dict(BLOCK_N=1, BLOCK_K=64, BCAST_X=1),
    ),
    (64, 96, 40, 32, 8, torch.float16, dict(BLOCK_N=8, BLOCK_K=32), dict(BLOCK_N=2, BLOCK_K=64)),
]
if CUDA:
    CASES.append(
        (
            2048,
            4096,
            12352,
            256,
            8,
            torch.bfloat16,
            dict(BLOCK_N=4, BLOCK_K=1024, BCAST_X=1),
            dict(BLOCK_N=1, BLOCK_K=1024, BCAST_X=1),
        )  # fmt: skip
    )


@pytest.mark.parametrize("case", CASES)
def test_project_in_raw_rows(case):
    H, Hv, n_in, E, _, dtype, p_in, _ = case
    lay = Layer(H, Hv, n_in, E, dtype)
    out = torch.full((1, n_in + E), float("nan"), dtype=dtype, device=DEVICE)
    y = gemv_triton(lay.h0, lay.w_in_ext, p_in, out, norm_weight=lay.g_in, norm_eps=1e-6, raw_from=n_in)
    ref = project_in_reference(lay.h0, lay.w_in_ext, n_in, lay.g_in, 1e-6)
    assert not y.isnan().any()
    assert rel_err(y[:, :n_in], ref[:, :n_in]) < TOL[dtype]
    assert rel_err(y[:, n_in:], ref[:, n_in:]) < TOL[dtype]
    # the in-projection's own columns: the bits of the GEMV without the extra rows
    plain = gemv_triton(lay.h0, lay.w_in, p_in, norm_weight=lay.g_in, norm_eps=1e-6)
    assert torch.equal(y[:, :n_in], plain)
    with pytest.raises(ValueError, match="raw_from"):
        gemv_triton(lay.h0, lay.w_in_ext, p_in, raw_from=n_in)


@pytest.mark.parametrize("reduce_each", [False, True])
@pytest.mark.parametrize("split", [1, 2, 4])
@pytest.mark.parametrize("case", CASES)
def test_project_out_route(case, split, reduce_each):
    """M_SPLIT: M's rows in column slices (multiples of 16, masked tiles where BLOCK_K is longer), the partial
    logits summed by the last program."""
    H, Hv, n_in, E, top_k, dtype, _, p_out = case
    lay = Layer(H, Hv, n_in, E, dtype, seed=1)
    partial = project_in_reference(lay.h0, lay.w_in_ext, n_in, lay.g_in, 1e-6)[:, n_in:]
    h_ref, h = lay.h0.clone(), lay.h0.clone()
    if split > 1 and Hv % (16 * split):
        with pytest.raises(ValueError, match="M_SPLIT"):
            project_out_route_triton(lay.a, lay.w_o_ext, h, partial, top_k, dict(p_out, M_SPLIT=split))
        return
    p_out = dict(p_out, M_SPLIT=split, REDUCE_EACH=reduce_each)
    ids, top = project_out_route_triton(lay.a, lay.w_o_ext, h, partial, top_k, p_out)
    ref_ids, ref_top = project_out_route_reference(lay.a, lay.w_o_ext, h_ref, partial, top_k)
    # h1: the GEMV's bits (same tiles, one cast of h0 + W_o a)
    assert torch.equal(h, gemv_triton(lay.a, lay.w_o, p_out, residual=lay.h0.clone()))
    assert rel_err(h, h_ref) < TOL[dtype]
    assert torch.equal(ids, ref_ids)
    assert rel_err(top, ref_top) < TOL[torch.float32]  # fp32 sums of the same products
    assert not ticket_counters("routed projection", lay.a.device, 1).any()
    again = project_out_route_triton(lay.a, lay.w_o_ext, lay.h0.clone(), partial, top_k, p_out)
    assert torch.equal(again[0], ids) and torch.equal(again[1], top)


@pytest.mark.parametrize("opts", [{}, dict(PREFETCH=1), dict(REDUCE_EACH=1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_experts_take_the_routing(dtype, opts):
    """The MoE with the routed projections' top-k (the gate_up kernel applying the pre-norm and the weights'
    softmax itself) against the MoE reference with its own router on h1."""
    from hyserve.kernels.moe import fused_moe_reference
    from hyserve.kernels.moe.triton_moe import fused_moe_triton

    H, Hv, n_in, E, top_k, inter = 64, 96, 40, 16, 4, 32
    lay = Layer(H, Hv, n_in, E, dtype, seed=2)
    gen = torch.Generator().manual_seed(3)
    w_gate_up = (torch.randn(E, 2 * inter, H, generator=gen) * H**-0.5).to(dtype).to(DEVICE)
    w_down = (torch.randn(E, H, inter, generator=gen) * inter**-0.5).to(dtype).to(DEVICE)
    s_gate_up = (torch.randn(2 * inter, H, generator=gen) * H**-0.5).to(dtype).to(DEVICE)
    s_down = (torch.randn(H, inter, generator=gen) * inter**-0.5).to(dtype).to(DEVICE)
    s_gate = (torch.randn(1, H, generator=gen) * H**-0.5).to(dtype).to(DEVICE)
    partial = project_in_reference(lay.h0, lay.w_in_ext, n_in, lay.g_in, 1e-6)[:, n_in:]
    h1 = lay.h0.clone()
    ids, top = project_out_route_reference(lay.a, lay.w_o_ext, h1, partial, top_k)
    weights = (lay.router, w_gate_up, w_down, top_k, s_gate_up, s_down, s_gate)
    ref = fused_moe_reference(h1, *weights, norm_weight=lay.g, norm_eps=1e-6, residual=h1.clone())
    ref_given = fused_moe_reference(
        h1, *weights, norm_weight=lay.g, norm_eps=1e-6, residual=h1.clone(), routing=(ids, top)
    )
    plan = pairs_plan(True, H, inter)
    plan = dict(plan, gate_up={**plan["gate_up"], **opts})
    out = fused_moe_triton(
        h1, *weights, plan=plan, norm_weight=lay.g, norm_eps=1e-6, residual=h1.clone(),
        routing=(ids, top),
    )  # fmt: skip
    assert rel_err(ref_given, ref) < TOL[dtype]
    assert not out.isnan().any() and rel_err(out, ref) < TOL[dtype]


def test_rejects_two_tokens():
    lay = Layer(64, 128, 96, 16, torch.float32)
    a2 = torch.cat([lay.a, lay.a])
    with pytest.raises(ValueError, match="one token"):
        project_out_route_triton(a2, lay.w_o_ext, lay.h0.repeat(2, 1), torch.zeros(2, 16, device=DEVICE), 4,
                                 dict(BLOCK_N=1, BLOCK_K=64))  # fmt: skip


def test_plans_prefer_the_extended_shapes(monkeypatch):
    """The projections with the router's rows take the GEMV table's entries for [n + E, k] where it has them,
    else the plain shapes'; a row block that does not divide E turns the feature off."""
    import hyserve.kernels.routed_projection as rp

    table = {
        (40, 64): dict(BLOCK_N=4, BLOCK_K=64),
        (96, 128): dict(BLOCK_N=4, BLOCK_K=128),
        (112, 128): dict(BLOCK_N=2, BLOCK_K=128, num_warps=2),
    }
    monkeypatch.setattr(rp, "gemv_plan", lambda n, k: table.get((n, k)))
    p_in, p_out = rp.plans(40, 64, 96, 128, 16)
    assert p_in is table[(40, 64)] and p_out is table[(112, 128)]
    table[(56, 64)] = dict(BLOCK_N=16, BLOCK_K=64)
    assert rp.plans(40, 64, 96, 128, 16) is None  # 16 does not divide n_in = 40
    del table[(56, 64)], table[(96, 128)], table[(112, 128)]
    assert rp.plans(40, 64, 96, 128, 16) is None
