"""Programmatic dependent launch: off on the CPU and with HYSERVE_PDL=0; on Hopper a chain of dependent
kernels launched with it (eager and graph-replayed) gives bit for bit the results of plain launches."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels import pdl

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def test_off_on_cpu() -> None:
    assert pdl.launch_options(torch.zeros(1)) == {"USE_PDL": False, "launch_pdl": False}


@pytest.mark.skipif(not HOPPER, reason="needs a GPU of compute capability >= 9")
def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.zeros(1, device="cuda")
    assert pdl.enabled(t)
    monkeypatch.setenv("HYSERVE_PDL", "0")
    assert not pdl.enabled(t)


def _chain(x: torch.Tensor, weights: list[torch.Tensor], norm_w: torch.Tensor) -> torch.Tensor:
    """Each kernel reads what the one before it wrote: norm -> GEMV -> residual norm -> GEMV ..."""
    from hyserve.kernels.linear.triton_kernel import gemv_triton
    from hyserve.kernels.rmsnorm.triton_kernel import rms_norm_triton

    cfg = {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 4}
    h = x
    for w in weights:
        normed, h = rms_norm_triton(gemv_triton(h, w, cfg), norm_w, 1e-6, residual=h)
        h = normed + h
    return h


@pytest.mark.skipif(not HOPPER, reason="needs a GPU of compute capability >= 9")
def test_dependent_chain_matches_plain_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    d = 2048
    x = torch.randn(1, d, device="cuda", generator=gen).bfloat16()
    weights = [(torch.randn(d, d, device="cuda", generator=gen) * d**-0.5).bfloat16() for _ in range(12)]
    norm_w = (torch.randn(d, device="cuda", generator=gen) * 0.1).bfloat16()
    monkeypatch.setenv("HYSERVE_PDL", "0")
    plain = _chain(x, weights, norm_w)
    monkeypatch.setenv("HYSERVE_PDL", "1")
    eager = _chain(x, weights, norm_w)
    torch.testing.assert_close(eager, plain, rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    _chain(static_x, weights, norm_w)  # compile before capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = _chain(static_x, weights, norm_w)
    for i in range(4):  # a new input every replay: a kernel that read it before its wait would see stale data
        if i:
            static_x.copy_(torch.randn(1, d, device="cuda", generator=gen).bfloat16())
            monkeypatch.setenv("HYSERVE_PDL", "0")
            plain = _chain(static_x, weights, norm_w)
            monkeypatch.setenv("HYSERVE_PDL", "1")
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(out, plain, rtol=0, atol=0)
