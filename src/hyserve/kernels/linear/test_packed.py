"""The GEMV over 12-bit packed bf16 weights (``triton_packed.py``) vs the reference on the unpacked weight:
odd shapes, every fusion, rows with many escapes, NaN-poisoned outputs. On the CPU the interpreter runs the
decode's shift-and-mask permutes; on the GPU the same tests run the ``prmt`` path at the model's shapes."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.linear.reference import linear_reference
from hyserve.kernels.linear.triton_packed import gemv_packed_triton
from hyserve.kernels.packed_bf16 import pack_bf16, unpack_bf16
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}


@pytest.fixture(autouse=True)
def _triton_env(monkeypatch):
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _inputs(m, n, k, dtype, seed=0, escapes=True):
    """x [m, k] in dtype, the packed weight, and its unpacked bf16 values as fp32 (the reference's W). With
    ``escapes``, row 0 gets zeros, row 3 values far below the rest (more escapes than one load of them) and,
    where the output's dtype holds the product, the last row a value far above."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).bfloat16()
    if escapes:
        w[0, : min(k, 40)] = 0.0
        w[min(3, n - 1), 1::7] = 1e-25
        if dtype != torch.float16:
            w[n - 1, 2] = 1e25
    packed = pack_bf16(w.to(DEVICE))
    return x.to(DEVICE), packed, unpack_bf16(packed).float()


SHAPES = [(1, 37, 80), (2, 12, 256), (4, 33, 96)] + (
    [(1, 12608, 2048), (1, 2304, 4096), (2, 9472, 2048)] if CUDA else []
)
# bf16 x takes the word loads the model runs; fp32 / fp16 the element loads (and fp16 the CPU's check that an
# fp16 output is cast right)
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if CUDA else [])
CONFIGS = [
    {"BLOCK_N": 1, "BLOCK_K": 64},
    {"BLOCK_N": 4, "BLOCK_K": 32, "num_warps": 2},
    {"BLOCK_N": 2, "BLOCK_K": 128, "REDUCE_EACH": 1},
    {"BLOCK_N": 1, "BLOCK_K": 32, "ESCAPES": 2},
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_packed_gemv_matches_reference(shape, dtype, cfg):
    m, n, k = shape
    x, packed, w = _inputs(m, n, k, dtype, seed=m * n + k)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    got = gemv_packed_triton(x, packed, cfg, out=out)
    assert got is out and not out.isnan().any()
    assert rel_err(out, linear_reference(x.float(), w)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fuse", ["norm", "residual", "both", "raw"])
@pytest.mark.parametrize("cfg", CONFIGS[:3] if CUDA else CONFIGS[1:3])
def test_packed_gemv_fusions(dtype, fuse, cfg):
    """``residual += rms_norm(x) W^T`` and the router's raw rows (from ``raw_from`` on, no norm), as the bf16
    GEMV fuses them."""
    m, n, k = 3, 48, 128
    x, packed, w = _inputs(m, n, k, dtype, seed=n + k)
    x = x * 3.0 + 0.25
    gen = torch.Generator().manual_seed(n)
    g = (torch.randn(k, generator=gen) * 0.3).to(dtype).to(DEVICE) if fuse != "residual" else None
    r = torch.randn(m, n, generator=gen).to(dtype).to(DEVICE) if fuse in ("residual", "both") else None
    raw_from = 32 if fuse == "raw" else None
    kw = dict(norm_weight=g, norm_eps=1e-6)
    want = linear_reference(x.float(), w, norm_weight=g.float() if g is not None else None, norm_eps=1e-6)
    if raw_from is not None:
        want[:, raw_from:] = linear_reference(x.float(), w[raw_from:])
    if r is None:
        got = gemv_packed_triton(x, packed, cfg, out=torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE),
                                 raw_from=raw_from, **kw)  # fmt: skip
    else:
        res = r.clone()
        got = gemv_packed_triton(x, packed, cfg, residual=res, **kw)
        assert got is res
        got = got.double() - r.double()
    assert not got.isnan().any()
    assert rel_err(got, want) < TOL[dtype]


def test_escapes_are_exact():
    """With fp32 x the result is the exact product up to fp32 summation: the escapes (zeros, values 2^-80 and
    2^+80 of the rest) add their true values, not their stand-ins."""
    x, packed, w = _inputs(2, 24, 64, torch.float32, seed=9)
    assert packed.escapes > 30
    got = gemv_packed_triton(x, packed, {"BLOCK_N": 1, "BLOCK_K": 32, "ESCAPES": 4})
    want = x.double() @ w.double().T
    assert rel_err(got, want) < 1e-6


def test_contracts():
    x, packed, _ = _inputs(1, 8, 64, torch.float32, escapes=False)
    with pytest.raises(ValueError, match="multiples of 8"):
        gemv_packed_triton(x, packed, {"BLOCK_N": 1, "BLOCK_K": 20})
    with pytest.raises(ValueError, match="TMA"):
        gemv_packed_triton(x, packed, {"BLOCK_N": 1, "BLOCK_K": 32, "TMA": 3})
    with pytest.raises(ValueError, match="row length"):
        gemv_packed_triton(x[:, :56], packed, {"BLOCK_N": 1, "BLOCK_K": 32})
    with pytest.raises(ValueError, match="at most 4"):
        gemv_packed_triton(x.expand(5, 64), packed, {"BLOCK_N": 1, "BLOCK_K": 32})
    wide = torch.zeros(2, 66, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="aligned"):
        gemv_packed_triton(wide[:, 2:], packed, {"BLOCK_N": 1, "BLOCK_K": 32})


def test_bench_smoke():
    import importlib

    bench = importlib.import_module("hyserve.kernels.linear.bench")
    rows = bench.bench_packed(40, 64, 1, [{"BLOCK_N": 1, "BLOCK_K": 64}])
    assert len(rows) == 2 and rows[1]["escapes_ppm"] >= 0


def test_strided_bf16_rows():
    """bf16 x rows inside a wider tensor (a row stride that is a multiple of 4, 8-byte aligned)."""
    x, packed, w = _inputs(3, 16, 64, torch.bfloat16, seed=11)
    wide = torch.zeros(3, 88, dtype=torch.bfloat16, device=DEVICE)
    wide[:, 8:72] = x
    got = gemv_packed_triton(wide[:, 8:72], packed, {"BLOCK_N": 4, "BLOCK_K": 32})
    assert rel_err(got, linear_reference(x.float(), w)) < TOL[torch.bfloat16]
