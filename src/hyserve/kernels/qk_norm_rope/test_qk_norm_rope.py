"""qk_norm_rope: reference vs a float64 formula; the Triton kernel vs the reference on strided q/k views."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.qk_norm_rope.reference import qk_norm_rope_reference, rope_cos_sin
from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _inputs(t, hq, hk, d, rot, dtype, seed=0):
    """q as the first d of each head of a [T, Hq, 2d] projection, k as a view of a [T, Hk*d] one."""
    gen = torch.Generator().manual_seed(seed)
    proj = (2 * torch.randn(t, hq, 2 * d, generator=gen)).to(dtype).to(DEVICE)
    q = proj[..., :d]
    k = torch.randn(t, hk * d, generator=gen).to(dtype).to(DEVICE).view(t, hk, d)
    qw = (0.3 * torch.randn(d, generator=gen)).to(dtype).to(DEVICE)
    kw = (0.3 * torch.randn(d, generator=gen)).to(dtype).to(DEVICE)
    positions = torch.randint(0, 5000, (t,), generator=gen).to(DEVICE)
    cos, sin = rope_cos_sin(torch.arange(5000, device=DEVICE), rot, 1e7)  # tables, read at the positions
    return q, k, qw, kw, cos, sin, positions


def _formula(x, w, positions, rot):
    freqs = positions.double()[:, None] * 1e7 ** (-torch.arange(0, rot, 2, dtype=torch.double) / rot)
    cos, sin = freqs.cos(), freqs.sin()
    x = x.double()
    y = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (1 + w.double())
    half = rot // 2
    c, s = cos.double()[:, None], sin.double()[:, None]
    a, b = y[..., :half], y[..., half:rot]
    return torch.cat([a * c - b * s, b * c + a * s, y[..., rot:]], dim=-1)


def test_reference_matches_formula():
    q, k, qw, kw, cos, sin, positions = (t.cpu() for t in _inputs(9, 6, 2, 40, 16, torch.float32))
    qo, ko = qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin, positions, 16)
    # the fp32 tables round the angle (positions up to 5000 x frequency) to ~3e-4 rad
    assert _rel(qo, _formula(q, qw, positions, 16)) < 1e-3
    assert _rel(ko, _formula(k, kw, positions, 16)) < 1e-3


CASES = [(9, 6, 2, 40, 16), (5, 3, 1, 64, 64), (4, 4, 3, 32, 8)]
CASES += [(4096, 16, 2, 256, 64), (1, 16, 2, 256, 64), (37, 16, 2, 256, 64)] if CUDA else []
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_matches_reference(case, dtype):
    t, hq, hk, d, rot = case
    q, k, qw, kw, cos, sin, positions = _inputs(t, hq, hk, d, rot, dtype)
    q_in, k_in = q.clone(), k.clone()
    qo, ko = qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin, positions, rot)
    qr, kr = qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin, positions, rot)
    assert torch.equal(q, q_in) and torch.equal(k, k_in)  # inputs untouched
    assert not qo.isnan().any() and not ko.isnan().any()
    assert _rel(qo, qr) < TOL[dtype] and _rel(ko, kr) < TOL[dtype]


def test_dispatch(monkeypatch):
    from hyserve.kernels.qk_norm_rope import qk_norm_rope

    args = _inputs(6, 4, 2, 32, 16, torch.float32)
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    for got, want in zip(
        qk_norm_rope(*args[:4], 1e-6, *args[4:], 16),
        qk_norm_rope_reference(*args[:4], 1e-6, *args[4:], 16),
    ):
        assert _rel(got, want) < 1e-5
