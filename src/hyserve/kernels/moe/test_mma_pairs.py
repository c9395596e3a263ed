"""mma_pairs: the down's reference against the plain bf16 down on the CPU; on the GPU both kernels against their
references (fresh random inputs, forced escapes, NaN-poisoned outputs, each tile variant, PDL on and off; the down
with and without the residual, the gate_up with and without the shared gate), against the Triton pairs kernels, and
the whole MoE block at one token over the copies (a given routing, as the decode step has) against the bf16 path,
eager and in a graph."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hyserve.kernels.moe.mma_experts import pack_mma_experts, shape_only
from hyserve.kernels.moe.mma_pairs import (
    KSPLITS,
    down_pairs_mma,
    down_pairs_mma_reference,
    down_pairs_mma_takes,
    gate_up_pairs_mma,
    gate_up_pairs_mma_reference,
)
from hyserve.kernels.testing import rel_err

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernel runs on the GPU only")


def _experts(E: int, H: int, inter: int, device: str, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    w = (torch.randn(E, 2 * inter, H, generator=gen, device=device) * H**-0.5).bfloat16()
    shared = (torch.randn(2 * inter, H, generator=gen, device=device) * H**-0.5).bfloat16()
    wd = (torch.randn(E, H, inter, generator=gen, device=device) * inter**-0.5).bfloat16()
    sd = (torch.randn(H, inter, generator=gen, device=device) * inter**-0.5).bfloat16()
    w[2, 3, :9] = 0.0  # escapes: gate_up rows of routed experts and of the shared expert
    w[5, inter + 40, 100:140] = 0.0
    shared[11, 7:9] = 0.0
    wd[2, 17, :5] = 0.0  # escapes: zeros in a row of nonzeros fall outside its 12-bit window
    wd[5, 40, 300:340] = 0.0
    sd[3, 7:9] = 0.0
    return w, shared, wd, sd, pack_mma_experts(w, shared, wd, sd)


def _inputs(T: int, E: int, k: int, inter: int, device: str, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen, device=device)[:k] for _ in range(T)]).int()
    ids[0, 0], ids[0, 1] = 2, 5  # the experts with escapes
    h = torch.randn(T * k + T, inter, generator=gen, device=device).bfloat16()
    return ids, h


def test_reference_is_the_bf16_down():
    """CPU: the reference over the copy equals the down over the bf16 weights (same fp32 math)."""
    E, H, inter, k, T = 16, 64, 128, 4, 3
    _, _, wd, sd, packed = _experts(E, H, inter, "cpu")
    ids, h = _inputs(T, E, k, inter, "cpu", seed=1)
    res = torch.randn(T, H).bfloat16()
    out = down_pairs_mma_reference(h, packed, ids, out=res.clone(), add_out=True)
    hf = h.float()
    want = res.float() + hf[T * k :] @ sd.float().T
    for t in range(T):
        for j in range(k):
            want[t] += hf[t * k + j] @ wd[ids[t, j]].float().T
    assert rel_err(out.float(), want.bfloat16().float()) < 1e-2
    assert not down_pairs_mma_takes(None, h, ids)  # no copy: the Triton path


@gpu
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("ksplit", KSPLITS)
@pytest.mark.parametrize("pdl", ["0", "1"])
@pytest.mark.parametrize("add_out", [False, True])
def test_kernel_matches_reference(monkeypatch, T, ksplit, pdl, add_out):
    monkeypatch.setenv("HYSERVE_PDL", pdl)
    E, H, inter, k = 256, 2048, 512, 8
    *_, packed = _experts(E, H, inter, "cuda")
    ids, h = _inputs(T, E, k, inter, "cuda", seed=T + ksplit)
    if add_out:
        res = torch.randn(T, H, device="cuda").bfloat16()
        out = down_pairs_mma(h, packed, ids, out=res.clone(), add_out=True, ksplit=ksplit)
        ref = down_pairs_mma_reference(h, packed, ids, out=res.clone(), add_out=True)
    else:
        out = torch.full((T, H), float("nan"), device="cuda", dtype=torch.bfloat16)
        out = down_pairs_mma(h, packed, ids, out=out, ksplit=ksplit)
        ref = down_pairs_mma_reference(h, packed, ids)
    assert not out.isnan().any()
    assert rel_err(out.float(), ref.float()) < 1e-2
    # the rows with escapes (expert 2's row 17, expert 5's row 40, the shared expert's row 3) on their own
    for col in (17, 40, 3):
        assert rel_err(out[0, col].float(), ref[0, col].float()) < 2e-2


@gpu
def test_kernel_matches_the_triton_down():
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.triton_pairs import down_pairs

    E, H, inter, k = 256, 2048, 512, 8
    _, _, wd, sd, packed = _experts(E, H, inter, "cuda")
    ids, h = _inputs(1, E, k, inter, "cuda", seed=9)
    plan = get_plan(1, E, H, inter, k, torch.bfloat16)
    triton = down_pairs(h, wd, sd, ids, plan["down"]) if plan["down_mode"] == "pairs" else None
    if triton is None:
        pytest.skip("the batch-1 plan does not take the pairs path")
    assert rel_err(down_pairs_mma(h, packed, ids).float(), triton.float()) < 1e-2


@gpu
def test_rejects_bad_inputs():
    E, H, inter, k = 16, 256, 128, 8
    *_, packed = _experts(E, H, inter, "cuda")
    ids, h = _inputs(1, E, k, inter, "cuda", seed=2)
    with pytest.raises(ValueError):
        down_pairs_mma(h, packed, ids, ksplit=2)  # I = 128 is one chunk: no K split
    with pytest.raises(ValueError):
        down_pairs_mma(h[:-1], packed, ids)
    with pytest.raises(ValueError):
        down_pairs_mma(h, packed, ids.long())


def _token(E: int, H: int, k: int, seed: int):
    """x [1, H] before the pre-norm, its norm weight, a shared gate, and a given routing (ids, raw logits)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(1, H, generator=gen, device="cuda") * 3).bfloat16()
    nw = (torch.randn(H, generator=gen, device="cuda") * 0.1).bfloat16()
    sg = (torch.randn(1, H, generator=gen, device="cuda") * H**-0.5).bfloat16()
    ids = torch.randperm(E, generator=gen, device="cuda")[:k].int()[None]
    ids[0, 0], ids[0, 1] = 2, 5  # the experts with escapes
    raw = torch.randn(1, k, generator=gen, device="cuda") * 40
    return x, nw, sg, ids, raw


@gpu
@pytest.mark.parametrize("tiles", [(2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)])
@pytest.mark.parametrize("pdl", ["0", "1"])
@pytest.mark.parametrize("gate", [True, False])
def test_gate_up_matches_reference(monkeypatch, tiles, pdl, gate):
    monkeypatch.setenv("HYSERVE_PDL", pdl)
    E, H, inter, k = 256, 2048, 512, 8
    *_, packed = _experts(E, H, inter, "cuda")
    x, nw, sg, ids, raw = _token(E, H, k, seed=sum(tiles))
    sg = sg if gate else None
    out = torch.full((k + 1, inter), float("nan"), device="cuda", dtype=torch.bfloat16)
    h = gate_up_pairs_mma(x, packed, ids, raw, nw, 1e-6, sg, tiles, out)
    ref = gate_up_pairs_mma_reference(x, packed, ids, raw, nw, 1e-6, sg)
    assert not h.isnan().any()
    assert rel_err(h.float(), ref.float()) < 1e-2
    for row in range(
        k + 1
    ):  # every pair on its own (the escapes' experts are rows 0, 1 and the shared expert)
        assert rel_err(h[row].float(), ref[row].float()) < 2e-2, row


@gpu
def test_gate_up_matches_the_triton_gate_up():
    """Against ``gate_up_pairs`` with the same given routing and its pre-norm inside (which keeps x_n in fp32)."""
    from hyserve.kernels.moe.configs import get_plan
    from hyserve.kernels.moe.triton_pairs import gate_up_pairs

    E, H, inter, k = 256, 2048, 512, 8
    w, shared, _, _, packed = _experts(E, H, inter, "cuda")
    x, nw, sg, ids, raw = _token(E, H, k, seed=21)
    plan = get_plan(1, E, H, inter, k, torch.bfloat16)
    triton = gate_up_pairs(x, w, shared, sg, ids, raw, plan["gate_up"], norm_weight=nw, norm_eps=1e-6)
    assert rel_err(gate_up_pairs_mma(x, packed, ids, raw, nw, 1e-6, sg).float(), triton.float()) < 1e-2


@gpu
def test_gate_up_rejects_bad_inputs():
    E, H, inter, k = 256, 2048, 512, 8
    *_, packed = _experts(E, H, inter, "cuda")
    x, nw, sg, ids, raw = _token(E, H, k, seed=3)
    for bad in (dict(tiles=(3, 1)), dict(tiles=(4, 3)), dict(x=x.float()), dict(topk_ids=ids.long())):
        args = dict(x=x, packed=packed, topk_ids=ids, raw_logits=raw, norm_weight=nw, norm_eps=1e-6)
        args.update(shared_expert_gate=sg, **bad)
        with pytest.raises(ValueError):
            gate_up_pairs_mma(**args)


@gpu
def test_fused_moe_at_one_token_over_the_copies(monkeypatch):
    """The decode step's MoE (a given routing, the pre-norm inside, the residual added in place): with ``packed``
    (both kernels over the copies) against the bf16 weights alone; replayed in a graph; and with only the copies."""
    from hyserve.kernels.moe.triton_moe import fused_moe_triton

    monkeypatch.setenv("HYSERVE_PDL", "1")
    E, H, inter, k = 256, 2048, 512, 8
    w, shared, wd, sd, packed = _experts(E, H, inter, "cuda")
    x, nw, sg, ids, raw = _token(E, H, k, seed=4)
    gate = torch.randn(E, H, device="cuda").bfloat16()  # unused with a given routing
    res = torch.randn(1, H, device="cuda").bfloat16()
    args = (x, gate, w, wd, k, shared, sd, sg)
    kw = dict(norm_weight=nw, norm_eps=1e-6, routing=(ids, raw))
    want = fused_moe_triton(*args, residual=res.clone(), **kw)
    got = fused_moe_triton(*args, residual=res.clone(), packed=packed, **kw)
    assert rel_err(got.float(), want.float()) < 1e-2
    r = res.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe_triton(*args, residual=r, packed=packed, **kw)
    r.copy_(res)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(r, got)
    # --mma-experts-only: the bf16 experts released to zero-byte views; the same kernels, so the same bits
    only = dataclasses.replace(packed, released=True)
    stubs = (shape_only(w), shape_only(wd))
    alone = fused_moe_triton(x, gate, *stubs, k, shared, sd, sg, residual=res.clone(), packed=only, **kw)
    assert torch.equal(alone, got)
