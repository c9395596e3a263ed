"""silu_and_mul: reference vs a float64 formula; the Triton kernel vs the reference (NaN-poisoned outputs)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.activation.reference import silu_and_mul_reference
from hyserve.kernels.activation.triton_kernel import silu_and_mul_triton
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def test_reference_matches_formula():
    x = torch.randn(5, 3, 2 * 40, dtype=torch.float64)
    g, u = x[..., :40], x[..., 40:]
    assert rel_err(silu_and_mul_reference(x), g / (1 + torch.exp(-g)) * u) < 1e-12


SHAPES = [(7, 2 * 40), (3, 2, 2 * 1500), (1, 2 * 512)] + ([(4096, 2 * 512), (64, 2 * 6144)] if CUDA else [])
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_matches_reference(shape, dtype):
    x = (2 * torch.randn(*shape)).to(dtype).to(DEVICE)
    out = torch.full((*shape[:-1], shape[-1] // 2), float("nan"), dtype=dtype, device=DEVICE)
    silu_and_mul_triton(x, out=out)
    assert not out.isnan().any()
    assert rel_err(out, silu_and_mul_reference(x)) < TOL[dtype]


def test_strided_and_dispatch(monkeypatch):
    import hyserve.kernels.activation as op

    x = torch.randn(6, 200, device=DEVICE)[::2, 20:100]  # row stride 400, 2I = 80
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    assert rel_err(op.silu_and_mul(x), silu_and_mul_reference(x)) < 1e-6
