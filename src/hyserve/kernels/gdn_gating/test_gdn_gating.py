"""gdn_gating: the reference vs a float64 formula; the Triton kernel vs the reference on the strided views
the model passes (NaN-poisoned outputs are overwritten, since the wrapper allocates them, every element checked)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.gdn_gating.reference import gdn_gating_reference
from hyserve.kernels.gdn_gating.triton_kernel import gdn_gating_triton

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _inputs(tokens: int, heads: int, dtype: torch.dtype, params: torch.dtype):
    gen = torch.Generator().manual_seed(tokens * 131 + heads)
    # a and b as in_proj's output columns: [T, total] with the gates at the end (row stride total)
    proj = (4 * torch.randn(tokens, 3 * heads + 5, generator=gen)).to(dtype).to(DEVICE)
    b, a = proj[:, 5 : 5 + heads], proj[:, 5 + heads : 5 + 2 * heads]
    a[:1, :2] = torch.tensor([30.0, -40.0], dtype=dtype)  # both softplus branches past the thresholds
    A_log = torch.randn(heads, generator=gen).to(params).to(DEVICE)
    dt_bias = torch.randn(heads, generator=gen).to(params).to(DEVICE)
    return a, b, A_log, dt_bias


def test_reference_matches_formula():
    a, b, A_log, dt_bias = (t.double().cpu() for t in _inputs(9, 6, torch.float64, torch.float64))
    g, beta = gdn_gating_reference(a, b, A_log, dt_bias)
    x = a + dt_bias
    assert torch.allclose(g.double(), -A_log.exp() * torch.log1p(torch.exp(x)), rtol=1e-6, atol=1e-30)
    assert torch.allclose(beta, 1 / (1 + torch.exp(-b)), rtol=1e-12)


@pytest.mark.parametrize("tokens", [1, 5, 64, 200])
@pytest.mark.parametrize("heads", [32, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else []))
def test_triton_matches_reference(tokens, heads, dtype):
    a, b, A_log, dt_bias = _inputs(tokens, heads, dtype, torch.float32)
    g, beta = gdn_gating_triton(a, b, A_log, dt_bias)
    g_ref, beta_ref = gdn_gating_reference(a, b, A_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == dtype
    assert not g.isnan().any() and not beta.isnan().any()
    torch.testing.assert_close(g, g_ref, rtol=2e-5, atol=1e-6)
    # beta is rounded to b's dtype from fp32 on both sides: equal or one rounding step apart
    torch.testing.assert_close(beta, beta_ref, rtol=1e-3 if dtype != torch.float32 else 1e-6, atol=0)


def test_dispatch_with_model_dtype_params(monkeypatch):
    from hyserve.kernels.gdn_gating import gdn_gating  # the package's attribute of that name is the op

    a, b, A_log, dt_bias = _inputs(7, 32, torch.float16, torch.float16)
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    g_ref, beta_ref = gdn_gating_reference(a, b, A_log, dt_bias)
    torch.testing.assert_close(g, g_ref, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(beta, beta_ref, rtol=1e-3, atol=0)
