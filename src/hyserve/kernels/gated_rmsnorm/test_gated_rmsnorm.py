"""gated_rms_norm: reference vs a float64 formula; the Triton kernel vs the reference (NaN-poisoned outputs)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.gated_rmsnorm.reference import gated_rms_norm_reference
from hyserve.kernels.gated_rmsnorm.triton_kernel import gated_rms_norm_triton
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _inputs(shape, dtype, w_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(*shape, generator=gen)).to(dtype).to(DEVICE)
    g = (2 * torch.randn(*shape, generator=gen)).to(dtype).to(DEVICE)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=gen)).to(w_dtype or dtype).to(DEVICE)
    return x, g, w


def test_reference_matches_formula():
    x, g, w = (t.cpu().double() for t in _inputs((5, 3, 40), torch.float32))
    want = w * x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * g * torch.sigmoid(g)
    assert rel_err(gated_rms_norm_reference(x.float(), g.float(), w.float(), 1e-6), want) < 1e-6


SHAPES = [(7, 40), (3, 5, 64), (2, 32, 128)] + ([(4096, 32, 128), (1, 32, 128)] if CUDA else [])
DTYPES = [(torch.float32, None), (torch.float16, None), (torch.float16, torch.float32)]
DTYPES += [(torch.bfloat16, None), (torch.bfloat16, torch.float32)] if CUDA else []


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtypes", DTYPES)
def test_triton_matches_reference(shape, dtypes):
    x, g, w = _inputs(shape, *dtypes)
    out = torch.full_like(x, float("nan"))
    gated_rms_norm_triton(x, g, w, 1e-6, out=out)
    assert not out.isnan().any()
    assert rel_err(out, gated_rms_norm_reference(x, g, w, 1e-6)) < TOL[dtypes[0]]


def test_strided_heads_and_dispatch(monkeypatch):
    import hyserve.kernels.gated_rmsnorm as op

    x, g, w = _inputs((4, 6, 80), torch.float32)
    xs, gs = x[:, ::2, :40], g[:, 1::2, 40:]  # [4, 3, 40] views with head stride 160
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    assert (
        rel_err(op.gated_rms_norm(xs, gs, w[:40], 1e-6), gated_rms_norm_reference(xs, gs, w[:40], 1e-6))
        < 1e-5
    )
