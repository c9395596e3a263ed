"""mma_grouped: on the GPU, the CUDA grouped gate_up and down over the experts' 12-bit copies against their
references (fp32 from the unpacked weights) at the model's shapes, NaN-poisoned, for each BLOCK_M the plans take,
PDL on and off, with and without the shared expert's gate; and against the Triton grouped kernels on the bf16
weights. (The layout and its bit-exact round trip are ``test_mma_experts.py``'s CPU tests.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hyserve.kernels.moe.mma_experts import pack_mma_experts, shape_only, unpack_mma_down
from hyserve.kernels.moe.mma_grouped import (
    down_grouped_mma,
    down_grouped_reference,
    gate_up_grouped_mma,
    gate_up_grouped_reference,
)
from hyserve.kernels.testing import rel_err

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the CUDA kernel runs on the GPU only (the CPU tests check its layout)",
)
E, INTER, HIDDEN, TOP_K = 256, 512, 2048, 8


@pytest.fixture(scope="module")
def experts():
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(E, 2 * INTER, HIDDEN, generator=gen, device="cuda") * HIDDEN**-0.5).bfloat16()
    shared = (torch.randn(2 * INTER, HIDDEN, generator=gen, device="cuda") * HIDDEN**-0.5).bfloat16()
    w[1, 3, :9] = 0.0  # escapes: zeros in a row of nonzeros fall outside its 12-bit window
    w[7, INTER + 5, 100:140] = 0.0
    sg = (torch.randn(1, HIDDEN, generator=gen, device="cuda") * HIDDEN**-0.5).bfloat16()
    wd = (torch.randn(E, HIDDEN, INTER, generator=gen, device="cuda") * INTER**-0.5).bfloat16()
    sd = (torch.randn(HIDDEN, INTER, generator=gen, device="cuda") * INTER**-0.5).bfloat16()
    wd[2, 17, :5] = 0.0
    return w, shared, sg, pack_mma_experts(w, shared, wd, sd)


def _routing(T: int, block_m: int, seed: int):
    from hyserve.kernels.moe.routing import route_and_align

    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(T, E, generator=gen, device="cuda")
    logits[: T // 2, 1] += 8.0  # expert 1 (with escapes) takes more than one block
    x = (torch.randn(T, HIDDEN, generator=gen, device="cuda") * 2).bfloat16()
    return x, route_and_align(logits, TOP_K, block_m, True, torch.bfloat16)


@pytest.mark.parametrize("T,block_m", [(24, 16), (200, 32), (1024, 64), (1500, 128)])
@pytest.mark.parametrize("pdl", ["0", "1"])
@pytest.mark.parametrize("gate", [True, False])
def test_kernel_matches_reference(monkeypatch, experts, T, block_m, pdl, gate):
    monkeypatch.setenv("HYSERVE_PDL", pdl)
    w, shared, sg, packed = experts
    x, rt = _routing(T, block_m, seed=T + block_m)
    routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks)
    out = torch.full((T * TOP_K + T, INTER), float("nan"), device="cuda", dtype=torch.bfloat16)
    h = gate_up_grouped_mma(x, packed, sg if gate else None, *routed, block_m, out=out)
    ref = gate_up_grouped_reference(x, packed, sg if gate else None, *routed)
    assert not h.isnan().any()
    assert rel_err(h.float(), ref.float()) < 1e-2
    worst = max(rel_err(h[r].float(), ref[r].float()) for r in range(0, h.shape[0], 97))
    assert worst < 2e-2


def test_kernel_matches_the_triton_gate_up(experts):
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.triton_gate_up import gate_up

    w, shared, sg, packed = experts
    plan = get_plan(1024, E, HIDDEN, INTER, TOP_K, torch.bfloat16)
    x, rt = _routing(1024, plan["block_m"], seed=5)
    routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks, plan["block_m"])
    triton = gate_up(x, w, shared, sg, *routed, plan["gate_up"])
    mma = gate_up_grouped_mma(x, packed, sg, *routed)
    assert rel_err(mma.float(), triton.float()) < 1e-2


def test_rejects_unsupported_shapes(experts):
    w, shared, sg, packed = experts
    x, rt = _routing(64, 16, seed=1)
    with pytest.raises(ValueError):
        gate_up_grouped_mma(x, packed, sg, rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks, 48)


def test_down_copy_round_trip(experts):
    packed = experts[3]
    wd, sd = unpack_mma_down(packed)
    assert wd.shape == (E, HIDDEN, INTER) and sd.shape == (HIDDEN, INTER) and wd[2, 17, :5].eq(0).all()


@pytest.mark.parametrize("T,block_m", [(24, 16), (200, 32), (1024, 64), (1500, 128)])
@pytest.mark.parametrize("pdl", ["0", "1"])
def test_down_matches_reference(monkeypatch, experts, T, block_m, pdl):
    monkeypatch.setenv("HYSERVE_PDL", pdl)
    packed = experts[3]
    _, rt = _routing(T, block_m, seed=3 * T)
    routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks)
    h = torch.randn(T * TOP_K + T, INTER, device="cuda").bfloat16()
    out = torch.full((T * TOP_K + T, HIDDEN), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = down_grouped_mma(h, packed, *routed, block_m, out=out)
    ref = down_grouped_reference(h, packed, *routed)
    assert not y.isnan().any()
    assert rel_err(y.float(), ref.float()) < 1e-2


def test_down_and_sum_match_the_triton_down(experts):
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.triton_prefill import down_scatter_sum, sum_rows

    packed = experts[3]
    wd, sd = unpack_mma_down(packed)
    T = 1024
    plan = get_plan(T, E, HIDDEN, INTER, TOP_K, torch.bfloat16)
    _, rt = _routing(T, plan["block_m"], seed=11)
    h = torch.randn(T * TOP_K + T, INTER, device="cuda").bfloat16()
    blocks = (rt.sorted_pairs, rt.meta, rt.max_blocks, plan["block_m"])
    triton = down_scatter_sum(h, wd, sd, *blocks, T, TOP_K, plan["down"])
    y = down_grouped_mma(h, packed, rt.topk_weights, *blocks)
    mma = sum_rows(y, torch.empty(T, HIDDEN, device="cuda", dtype=torch.bfloat16), T, TOP_K, True, False)
    assert rel_err(mma.float(), triton.float()) < 1e-2


@pytest.mark.parametrize(
    "T,block_m,tiles",
    [(200, 32, (4, 2, 0)), (1024, 64, (8, 2, 0))]
    + [
        (T, bm, (w, 1, d))
        for T, bm in [(24, 16), (200, 32), (1024, 64), (1500, 128)]
        for w, d in [(4, 2), (8, 1)]
    ],
)
@pytest.mark.parametrize("pdl", ["0", "1"])
def test_tiles_match_reference(monkeypatch, experts, T, block_m, tiles, pdl):
    """RT 16-row tiles a warp (one B fragment for RT mma's) and the wgmma kernel (a warpgroup's 64 rows the A
    operand, the tokens from swizzled shared memory; one and two weight chunks ahead): the reference's results,
    gate_up and down, NaN-poisoned."""
    monkeypatch.setenv("HYSERVE_PDL", pdl)
    w, shared, sg, packed = experts
    x, rt = _routing(T, block_m, seed=7 * T)
    routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks)
    out = torch.full((T * TOP_K + T, INTER), float("nan"), device="cuda", dtype=torch.bfloat16)
    h = gate_up_grouped_mma(x, packed, sg, *routed, block_m, tiles=tiles, out=out)
    assert not h.isnan().any()
    assert rel_err(h.float(), gate_up_grouped_reference(x, packed, sg, *routed).float()) < 1e-2
    out = torch.full((T * TOP_K + T, HIDDEN), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = down_grouped_mma(h, packed, *routed, block_m, tiles=tiles, out=out)
    assert not y.isnan().any()
    assert rel_err(y.float(), down_grouped_reference(h, packed, *routed).float()) < 1e-2


@pytest.mark.parametrize("T,block_m", [(200, 32), (1024, 64)])
def test_l2_lookahead_moves_no_bits(monkeypatch, experts, T, block_m):
    """The L2 prefetch of the weight chunks past a warp's register ring (``L2_AHEAD``) changes no result: the same
    bits with 0, 1 and 3 chunks ahead (3 reaches past the down's 4 chunks), with the plans' wgmma tiles."""
    from hyserve.kernels.moe import mma_grouped

    w, shared, sg, packed = experts
    x, rt = _routing(T, block_m, seed=11 * T)
    routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks, block_m)
    outs = []
    for ahead in (0, 1, 3):
        monkeypatch.setattr(mma_grouped, "L2_AHEAD", ahead)
        h = gate_up_grouped_mma(x, packed, sg, *routed)
        outs.append((h, down_grouped_mma(h, packed, *routed)))
    for h, y in outs[1:]:
        assert torch.equal(h, outs[0][0]) and torch.equal(y, outs[0][1])


@pytest.mark.parametrize("tiles", [(4, 2, 1), (2, 1, 1), (4, 1, 3)])
def test_rejects_unsupported_wgmma_tiles(experts, tiles):
    """Row tiles, part of a warpgroup, or three chunks ahead."""
    w, shared, sg, packed = experts
    x, rt = _routing(64, 16, seed=1)
    routed = (rt.topk_weights, rt.sorted_pairs, rt.meta, rt.max_blocks, 16)
    with pytest.raises(ValueError):
        gate_up_grouped_mma(x, packed, sg, *routed, tiles=tiles)


def test_fused_moe_over_the_copies_matches_the_bf16_path(experts):
    """The whole MoE block with ``packed`` = the 12-bit copies against the Triton kernels on the bf16 weights, at
    token counts routed at BLOCK_M 16 and 64 (the grouped kernels over the copies) and 128 (2048: the Triton kernels
    on both sides)."""
    from hyserve.kernels.moe.triton_moe import fused_moe_triton

    w, shared, sg, packed = experts
    wd, sd = unpack_mma_down(packed)
    gen = torch.Generator(device="cuda").manual_seed(13)
    gate = (torch.randn(E, HIDDEN, generator=gen, device="cuda") * HIDDEN**-0.5).bfloat16()
    for T in (64, 1024, 2048):
        x = torch.randn(T, HIDDEN, generator=gen, device="cuda").bfloat16()
        args = (x, gate, w, wd, TOP_K, shared, sd, sg)
        bf16 = fused_moe_triton(*args)
        mma = fused_moe_triton(*args, packed=packed)
        assert rel_err(mma.float(), bf16.float()) < 1e-2, T


def test_a_plan_can_keep_the_bf16_weights(experts):
    """A bucket's ``"mma_grouped": false`` runs the bf16 kernels although the copies exist: the same bits as
    without the copies, where the copies' path differs from them."""
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.triton_moe import fused_moe_triton

    w, shared, sg, packed = experts
    wd, sd = unpack_mma_down(packed)
    gen = torch.Generator(device="cuda").manual_seed(19)
    gate = (torch.randn(E, HIDDEN, generator=gen, device="cuda") * HIDDEN**-0.5).bfloat16()
    x = torch.randn(1024, HIDDEN, generator=gen, device="cuda").bfloat16()
    plan = get_plan(1024, E, HIDDEN, INTER, TOP_K, torch.bfloat16)
    args = (x, gate, w, wd, TOP_K, shared, sd, sg)
    bf16 = fused_moe_triton(*args, plan=plan)
    kept = fused_moe_triton(*args, plan={**plan, "mma_grouped": False}, packed=packed)
    copies = fused_moe_triton(*args, plan=plan, packed=packed)
    assert torch.equal(kept, bf16)
    assert not torch.equal(copies, bf16)


def test_fused_moe_with_only_the_copies_matches_the_bf16_path(experts):
    """``--mma-experts-only``: the bf16 routed experts are zero-byte views, so every token count must take the
    copies: the few-token pairs plans (T <= 8) and the prefills' BLOCK_M 128 (T >= ~2048) re-planned onto the grouped
    12-bit kernels at 16 and 64. Against the Triton kernels on the bf16 weights, with the pre-norm and the residual
    add; NaN anywhere would mean a bf16 kernel read the released views."""
    from hyserve.kernels.moe.triton_moe import fused_moe_triton

    w, shared, sg, packed = experts
    wd, sd = unpack_mma_down(packed)
    only = dataclasses.replace(packed, released=True)
    stub_w, stub_wd = shape_only(w), shape_only(wd)
    gen = torch.Generator(device="cuda").manual_seed(17)
    gate = (torch.randn(E, HIDDEN, generator=gen, device="cuda") * HIDDEN**-0.5).bfloat16()
    nw = (1 + 0.1 * torch.randn(HIDDEN, generator=gen, device="cuda")).bfloat16()
    for T in (1, 3, 8, 40, 600, 2100):
        x = torch.randn(T, HIDDEN, generator=gen, device="cuda").bfloat16()
        res = torch.randn(T, HIDDEN, generator=gen, device="cuda").bfloat16()
        kw = dict(norm_weight=nw, norm_eps=1e-6)
        bf16 = fused_moe_triton(x, gate, w, wd, TOP_K, shared, sd, sg, residual=res.clone(), **kw)
        mma = fused_moe_triton(
            x, gate, stub_w, stub_wd, TOP_K, shared, sd, sg, residual=res.clone(), packed=only, **kw
        )
        assert not mma.isnan().any(), T
        assert rel_err(mma.float() - res.float(), bf16.float() - res.float()) < 1e-2, T
