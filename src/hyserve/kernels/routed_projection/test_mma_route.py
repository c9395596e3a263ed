"""The routing out-projection over the fragment-ordered 12-bit copy (``mma_kernel.py``, CUDA): against the
reference on the copy's values at the model's shape, NaN-poisoned h1 rows checked, every KSPLIT, PDL on and off,
counters left at zero, a graph replay equal to the eager call. GPU only (the CPU tests of ``mma_gemv`` check the
layout it reads)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.mma_gemv import pack_mma, unpack_mma
from hyserve.kernels.routed_projection.reference import project_out_route_reference
from hyserve.kernels.testing import rel_err
from hyserve.kernels.tickets import ticket_counters

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernel runs on the GPU only")

E, H, K, TOP = 256, 2048, 4096, 8


def _inputs(seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(E + H, K, device="cuda", generator=gen) * K**-0.5).bfloat16()
    w[3, :50] = 0.0  # escapes in M's rows and in W_o's
    w[E + 7, 1::9] = 1e-20
    a = torch.randn(1, K, device="cuda", generator=gen).bfloat16()
    h0 = torch.randn(1, H, device="cuda", generator=gen).bfloat16()
    partial = (torch.randn(1, E, device="cuda", generator=gen) * 3).bfloat16()
    return pack_mma(w), a, h0, partial


@pytest.mark.parametrize("split", [4, 8])
@pytest.mark.parametrize("ksplit", [1, 2, 4])
@pytest.mark.parametrize("pdl", ["0", "1"])
def test_kernel_matches_reference(monkeypatch, split, ksplit, pdl):
    from hyserve.kernels.routed_projection.mma_kernel import project_out_route_mma

    monkeypatch.setenv("HYSERVE_PDL", pdl)
    packed, a, h0, partial = _inputs(split * 10 + ksplit)
    h_ref = h0.clone()
    ids_ref, top_ref = project_out_route_reference(a, unpack_mma(packed), h_ref, partial, TOP)
    h = h0.clone()
    ids, top = project_out_route_mma(a, packed, h, partial, TOP, {"SPLIT": split, "KSPLIT": ksplit})
    torch.cuda.synchronize()
    assert rel_err(h.float(), h_ref.float()) < 4e-3
    assert rel_err(top.float(), top_ref.float()) < 1e-4
    assert ids.tolist() == ids_ref.tolist() or set(ids[0].tolist()) == set(ids_ref[0].tolist())
    assert (top[0, :-1] >= top[0, 1:]).all()  # largest first
    counters = ticket_counters("routed projection (mma)", torch.device("cuda"), (E + H) // 16 + 1)
    assert int(counters.abs().sum()) == 0


def test_graph_replay_equals_the_eager_call():
    from hyserve.kernels.routed_projection.mma_kernel import project_out_route_mma

    packed, a, h0, partial = _inputs(1)
    plan = {"SPLIT": 8, "KSPLIT": 4}
    h = h0.clone()
    ids, top = project_out_route_mma(a, packed, h, partial, TOP, plan)
    h_eager, ids_eager, top_eager = h.clone(), ids.clone(), top.clone()
    graph = torch.cuda.CUDAGraph()
    h.copy_(h0)
    with torch.cuda.graph(graph):
        ids_g, top_g = project_out_route_mma(a, packed, h, partial, TOP, plan)
    for _ in range(3):
        h.copy_(h0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(h, h_eager) and torch.equal(ids_g, ids_eager) and torch.equal(top_g, top_eager)
