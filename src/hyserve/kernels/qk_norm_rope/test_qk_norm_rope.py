"""qk_norm_rope: reference vs a float64 formula; the Triton kernel vs the reference on strided q/k views.
qk_norm_rope_store: the fused kernel vs the reference composition on the model's q/k/v views and NaN-filled
caches (only the slots given are written)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.qk_norm_rope.reference import (
    qk_norm_rope_reference,
    qk_norm_rope_store_reference,
    rope_cos_sin,
)
from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_store_triton, qk_norm_rope_triton
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


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
    assert rel_err(qo, _formula(q, qw, positions, 16)) < 1e-3
    assert rel_err(ko, _formula(k, kw, positions, 16)) < 1e-3


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
    assert rel_err(qo, qr) < TOL[dtype] and rel_err(ko, kr) < TOL[dtype]


def test_dispatch(monkeypatch):
    from hyserve.kernels.qk_norm_rope import qk_norm_rope

    args = _inputs(6, 4, 2, 32, 16, torch.float32)
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    for got, want in zip(
        qk_norm_rope(*args[:4], 1e-6, *args[4:], 16),
        qk_norm_rope_reference(*args[:4], 1e-6, *args[4:], 16),
    ):
        assert rel_err(got, want) < 1e-5


def _store_inputs(t, hq, hk, d, rot, page, dtype, strided_cache=False, seed=0):
    """q, k, v as the model's views of one qkv projection [T, Hq*2d + 2*Hk*d] (q: the first d of each
    [query | gate] head), NaN-filled caches [num_blocks, page, Hk, d] (contiguous, or strided views), and
    distinct slots with every third token's negative (from the second on: a single token is stored). With
    ``strided_cache`` v also comes from a separate buffer, so no stride of k and v coincides."""
    gen = torch.Generator().manual_seed(seed)
    proj = (2 * torch.randn(t, hq * 2 * d + 2 * hk * d, generator=gen)).to(dtype).to(DEVICE)
    q_gate, k, v = proj.split([hq * 2 * d, hk * d, hk * d], dim=-1)
    q = q_gate.view(t, hq, 2 * d)[..., :d]
    _, _, qw, kw, cos, sin, positions = _inputs(t, hq, hk, d, rot, dtype, seed)
    num_blocks = (t + page - 1) // page + 2

    def nan(*shape):
        return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)

    if strided_cache:  # k's and v's caches differ in every stride but the last
        k_cache = nan(num_blocks, page, hk + 1, 2 * d)[:, :, 1:, :d]
        v_cache = nan(num_blocks, page + 1, hk, 5 * d)[:, 1:, :, d : 2 * d]
    else:
        k_cache, v_cache = nan(num_blocks, page, hk, d), nan(num_blocks, page, hk, d)
    slots = torch.randperm(num_blocks * page, generator=gen)[:t]
    slots[1::3] = -1
    v = v.view(t, hk, d)
    if strided_cache:  # v from a buffer of its own: its token and head strides differ from k's
        v = (2 * torch.randn(t, hk + 1, 3 * d, generator=gen)).to(dtype).to(DEVICE)[:, 1:, d : 2 * d]
    args = (q, k.view(t, hk, d), v, qw, kw, 1e-6, cos, sin, positions, rot)
    return args, k_cache, v_cache, slots.to(DEVICE)


STORE_CASES = [(9, 6, 2, 40, 16, 4), (5, 3, 1, 64, 64, 16), (4, 4, 3, 32, 8, 2)]
STORE_CASES += [(1, 16, 2, 256, 64, 16), (37, 16, 2, 256, 64, 16)] if CUDA else []


@pytest.mark.parametrize("case", STORE_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strided_cache", [False, True])
def test_store_matches_reference(case, dtype, strided_cache):
    *shape, page = case
    args, kc, vc, slots = _store_inputs(*shape, page, dtype, strided_cache)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    before = [a.clone() for a in tensors]
    kc_ref, vc_ref = kc.clone(), vc.clone()
    qo = qk_norm_rope_store_triton(*args, kc, vc, slots)
    qr = qk_norm_rope_store_reference(*args, kc_ref, vc_ref, slots)
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))  # inputs untouched
    assert qo.is_contiguous() and not qo.isnan().any() and rel_err(qo, qr) < TOL[dtype]
    # what no slot points at (the negative slots' tokens write nowhere) keeps its NaN; the stored rows match
    assert torch.equal(kc.isnan(), kc_ref.isnan()) and torch.equal(vc.isnan(), vc_ref.isnan())
    kept = slots[slots >= 0]
    assert kept.numel() > 0 and bool((slots < 0).any()) == (slots.numel() > 1)
    k_rows, k_ref, v_rows, v_ref = (c.flatten(0, 1)[kept] for c in (kc, kc_ref, vc, vc_ref))
    assert not k_rows.isnan().any() and not v_rows.isnan().any()
    assert rel_err(k_rows, k_ref) < TOL[dtype] and torch.equal(v_rows, v_ref)  # v: copied as is


def test_store_dispatch(monkeypatch):
    """The op matches the reference composition through the fused kernel when it applies, and through the
    two ops (qk_norm_rope, store_kv) when it does not (a cache of another dtype than q)."""
    from hyserve.kernels.qk_norm_rope import qk_norm_rope_store, triton_kernel

    fused = []
    monkeypatch.setattr(
        triton_kernel,
        "qk_norm_rope_store_triton",
        lambda *a: fused.append(1) or qk_norm_rope_store_triton(*a),
    )
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    for cache_dtype, fused_calls in ((torch.float32, 1), (torch.float16, 1)):  # counted over the loop
        args, kc, vc, slots = _store_inputs(7, 4, 2, 32, 16, 4, torch.float32)
        kc, vc = kc.to(cache_dtype), vc.to(cache_dtype)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        got = qk_norm_rope_store(*args, kc, vc, slots)
        want = qk_norm_rope_store_reference(*args, kc_ref, vc_ref, slots)
        assert len(fused) == fused_calls and rel_err(got, want) < 1e-5
        assert torch.equal(kc.isnan(), kc_ref.isnan()) and torch.equal(vc.isnan(), vc_ref.isnan())
        assert rel_err(kc.nan_to_num(), kc_ref.nan_to_num()) < 1e-3
        assert torch.equal(vc.nan_to_num(), vc_ref.nan_to_num())
