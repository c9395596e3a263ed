"""rms_norm: reference vs a float64 formula; the Triton kernel vs the reference (NaN-poisoned outputs)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.rmsnorm.reference import rms_norm_reference
from hyserve.kernels.rmsnorm.triton_kernel import rms_norm_triton
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _inputs(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(*shape, generator=gen)).to(dtype).to(DEVICE)
    r = torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)
    w = (0.5 * torch.randn(shape[-1], generator=gen)).to(dtype).to(DEVICE)
    return x, r, w


def test_reference_matches_formula():
    x, r, w = (t.cpu() for t in _inputs((3, 5, 40), torch.float32))
    h = x.double() + r.double()
    want = h / (h.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (1 + w.double())
    out, hs = rms_norm_reference(x, w, 1e-6, r)
    assert rel_err(out, want) < 1e-6 and rel_err(hs, h) < 1e-7
    x0 = x.double()
    assert (
        rel_err(
            rms_norm_reference(x, w, 1e-6), x0 / (x0.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * (1 + w)
        )
        < 1e-6
    )


SHAPES = [(7, 40), (3, 5, 64), (1, 2048), (33, 2048)] + ([(4096, 2048), (5, 256)] if CUDA else [])
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_matches_reference(shape, dtype):
    x, r, w = _inputs(shape, dtype)
    out = torch.full_like(x, float("nan"))
    rms_norm_triton(x, w, 1e-6, out=out)
    assert rel_err(out, rms_norm_reference(x, w, 1e-6)) < TOL[dtype]
    out = torch.full_like(x, float("nan"))
    got, h = rms_norm_triton(x, w, 1e-6, r, out=out)
    want, want_h = rms_norm_reference(x, w, 1e-6, r)
    assert torch.equal(h, want_h)  # the sum is rounded exactly as x + residual
    assert not got.isnan().any() and rel_err(got, want) < TOL[dtype]


def test_strided_rows_and_dispatch(monkeypatch):
    import hyserve.kernels.rmsnorm as op

    x, r, w = _inputs((6, 96), torch.float32)
    xs = x[::2, :40]  # row stride 192, 40 columns
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    assert rel_err(op.rms_norm(xs, w[:40], 1e-6), rms_norm_reference(xs, w[:40], 1e-6)) < 1e-5
    got, h = op.rms_norm(xs, w[:40], 1e-6, r[1::2, 8:48])
    want, want_h = rms_norm_reference(xs, w[:40], 1e-6, r[1::2, 8:48])
    assert rel_err(got, want) < 1e-5 and torch.equal(h, want_h)
