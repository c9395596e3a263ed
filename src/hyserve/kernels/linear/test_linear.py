"""linear: the Triton GEMV vs the reference on odd shapes (NaN-poisoned outputs), the dispatch rules."""

from __future__ import annotations

import importlib

import pytest
import torch

from hyserve.kernels.linear.reference import linear_reference
from hyserve.kernels.linear.triton_kernel import gemv_triton
from hyserve.kernels.testing import rel_err

# the modules (``hyserve.kernels.linear`` the attribute is the op function)
linear_op = importlib.import_module("hyserve.kernels.linear")
triton_kernel = importlib.import_module("hyserve.kernels.linear.triton_kernel")

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}


@pytest.fixture(autouse=True)
def _triton_env(monkeypatch):
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _inputs(m, n, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype).to(DEVICE)
    return x, w


def test_reference_matches_formula():
    x, w = (t.cpu() for t in _inputs(3, 7, 20, torch.float32))
    assert rel_err(linear_reference(x, w), x.double() @ w.double().T) < 1e-6


SHAPES = [(1, 37, 80), (2, 64, 200), (3, 5, 64), (4, 130, 96)] + (
    [(1, 12352, 2048), (4, 2048, 4096)] if CUDA else []
)
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "cfg",
    [
        {"BLOCK_N": 4, "BLOCK_K": 32},
        {"BLOCK_N": 16, "BLOCK_K": 64, "num_warps": 8},
        {"BLOCK_N": 4, "BLOCK_K": 32, "REDUCE_EACH": 1},
        {"BLOCK_N": 4, "BLOCK_K": 32, "TMA": 3},
        {"BLOCK_N": 2, "BLOCK_K": 64, "TMA": 2, "REDUCE_EACH": 1},
        {"BLOCK_N": 4, "BLOCK_K": 32, "BCAST_X": 1},
        {"BLOCK_N": 1, "BLOCK_K": 32, "BCAST_X": 1},
        {"BLOCK_N": 4, "BLOCK_K": 32, "BCAST_X": 1, "maxnreg": 64},
    ],
)
def test_gemv_matches_reference(shape, dtype, cfg):
    m, n, k = shape
    x, w = _inputs(m, n, k, dtype, seed=m * n + k)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    got = gemv_triton(x, w, cfg, out=out)
    assert got is out and not out.isnan().any()
    assert rel_err(out, linear_reference(x, w)) < TOL[dtype]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fuse", ["norm", "residual", "both"])
@pytest.mark.parametrize("reduce_each", [0, 1, "tma", "bcast_x", "bcast_x_reduce_each"])
def test_gemv_fused_norm_and_residual(shape, dtype, fuse, reduce_each):
    """``residual += rms_norm(x) W^T`` in one kernel vs the reference (norm rounded to x's dtype, then
    F.linear, then the add): the GEMV never rounds the normed x, so bf16 is compared on the product."""
    m, n, k = shape
    x, w = _inputs(m, n, k, dtype, seed=m + n + k)
    x = x * 3.0 + 0.25
    gen = torch.Generator().manual_seed(n)
    g = (torch.randn(k, generator=gen) * 0.3).to(dtype).to(DEVICE) if fuse != "residual" else None
    r = torch.randn(m, n, generator=gen).to(dtype).to(DEVICE) if fuse != "norm" else None
    cfg = {
        "BLOCK_N": 4,
        "BLOCK_K": 32,
        "REDUCE_EACH": reduce_each in (1, "bcast_x_reduce_each"),
        "TMA": 3 if reduce_each == "tma" else 0,
        "BCAST_X": str(reduce_each).startswith("bcast_x"),
    }
    kw = dict(norm_weight=g, norm_eps=1e-6)
    want = linear_reference(x, w, **kw, residual=r.clone() if r is not None else None)
    if r is None:
        out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
        got = gemv_triton(x, w, cfg, out=out, **kw)
        assert got is out
    else:
        res = r.clone()
        got = gemv_triton(x, w, cfg, **kw, residual=res)
        assert got is res
    assert not got.isnan().any()
    base = r if r is not None else torch.zeros_like(got)
    assert rel_err(got.double() - base.double(), want.double() - base.double()) < TOL[dtype]


def test_linear_reference_norm_and_residual():
    x, w = (t.cpu() for t in _inputs(3, 7, 20, torch.float32))
    g, r = torch.randn(20), torch.randn(3, 7)
    xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + g)
    res = r.clone()
    got = linear_reference(x, w, norm_weight=g, norm_eps=1e-6, residual=res)
    assert got is res and rel_err(got, r.double() + xn.double() @ w.double().T) < 1e-6


@pytest.mark.parametrize("rows", [2, 6])
def test_linear_op_norm_and_residual(rows, monkeypatch):
    """The op on both of its fast paths: the fused GEMV (few rows), and above GEMV_MAX_ROWS the Triton norm,
    then cuBLAS with the residual added in its epilogue (``addmm_``); leading dims flattened."""
    monkeypatch.setattr(linear_op, "_plans", lambda: {"24x48": {"BLOCK_N": 8, "BLOCK_K": 16}})
    x, w = _inputs(rows, 24, 48, torch.float32, seed=rows)
    g = torch.randn(48, device=DEVICE) * 0.3
    r = torch.randn(rows, 1, 24, device=DEVICE)
    res = r.clone()
    got = linear_op.linear(x.view(rows, 1, 48), w, norm_weight=g, norm_eps=1e-6, residual=res)
    want = linear_reference(x.view(rows, 1, 48), w, norm_weight=g, norm_eps=1e-6, residual=r.clone())
    assert got is res and rel_err(got, want) < 1e-5
    with pytest.raises(ValueError, match="residual"):
        linear_op.linear(x, w, residual=torch.zeros(rows, 23, device=DEVICE))


def test_gemv_strided_rows():
    x, w = _inputs(2, 24, 48, torch.float32, seed=3)
    wide = torch.randn(2, 100, device=DEVICE)
    wide[:, 10:58] = x
    got = gemv_triton(wide[:, 10:58], w, {"BLOCK_N": 8, "BLOCK_K": 16})
    assert rel_err(got, linear_reference(x, w)) < 1e-5


def test_gemv_rejects_too_many_rows():
    x, w = _inputs(5, 8, 16, torch.float32)
    with pytest.raises(ValueError, match="at most 4"):
        gemv_triton(x, w, {"BLOCK_N": 8, "BLOCK_K": 16})


def test_dispatch(monkeypatch):
    calls = []
    real = gemv_triton

    def spy(*a, **k):
        calls.append(a[0].shape)
        return real(*a, **k)

    monkeypatch.setattr(triton_kernel, "gemv_triton", spy)
    monkeypatch.setattr(
        linear_op, "_plans", lambda: {"24x48": {"BLOCK_N": 8, "BLOCK_K": 16}, "8x48": "cublas"}
    )
    x, w = _inputs(3, 24, 48, torch.float32, seed=5)
    got = linear_op.linear(x.view(3, 1, 48), w)  # leading dims are flattened into rows
    assert got.shape == (3, 1, 24) and calls == [(3, 48)]
    assert rel_err(got.view(3, 24), linear_reference(x, w)) < 1e-5
    x5, _ = _inputs(5, 24, 48, torch.float32)
    linear_op.linear(x5, w)  # more rows than the GEMV takes: cuBLAS
    linear_op.linear(x[:, :48], w[:8])  # the sweep chose cuBLAS for this shape
    linear_op.linear(x, torch.randn(7, 48, device=DEVICE))  # no plan for this shape
    assert len(calls) == 1
    monkeypatch.setenv("HYSERVE_KERNELS", "reference")
    linear_op.linear(x, w)
    assert len(calls) == 1


def test_plan_max_rows(monkeypatch):
    """A plan's ``max_rows`` caps the rows it takes (the LM head's GEMV loses to cuBLAS from 2 rows)."""
    calls = []
    real = gemv_triton
    monkeypatch.setattr(
        triton_kernel, "gemv_triton", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k)
    )
    monkeypatch.setattr(linear_op, "_plans", lambda: {"24x48": {"BLOCK_N": 8, "BLOCK_K": 16, "max_rows": 1}})
    x, w = _inputs(3, 24, 48, torch.float32, seed=6)
    assert rel_err(linear_op.linear(x, w), linear_reference(x, w)) < 1e-5  # 3 rows: cuBLAS
    assert rel_err(linear_op.linear(x[:1], w), linear_reference(x[:1], w)) < 1e-5  # 1 row: the GEMV
    assert calls == [(1, 48)]


def test_bench_smoke(capsys):
    bench = importlib.import_module("hyserve.kernels.linear.bench")
    rows, best = bench.bench_shape(40, 64, 1, [{"BLOCK_N": 4, "BLOCK_K": 32}])
    assert len(rows) == 2 and best in ("cublas", {"BLOCK_N": 4, "BLOCK_K": 32})


def test_bench_max_rows_smoke():
    bench = importlib.import_module("hyserve.kernels.linear.bench")
    table, max_rows = bench.bench_max_rows(40, 64, {"BLOCK_N": 4, "BLOCK_K": 32})
    assert [r["rows"] for r in table] == [1, 2, 3, 4] and 0 <= max_rows <= 4
