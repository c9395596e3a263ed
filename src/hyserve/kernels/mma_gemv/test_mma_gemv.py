"""mma_gemv: the fragment-ordered 12-bit layout gives back every bf16 bit; the kernel's decode (emulated in torch
by its own indexing, on the CPU) builds the right A registers; on the GPU the CUDA kernel against the reference
at the model's shapes, with escapes, the norm, raw rows, NaN-poisoned outputs, every SPLIT, PDL and graphs."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.mma_gemv import gemv_mma, gemv_mma_reference, mma_plan, pack_mma, unpack_mma
from hyserve.kernels.mma_gemv.cuda_kernel import SPLITS
from hyserve.kernels.mma_gemv.layout import (
    FRAG_COL,
    FRAG_ROW,
    emulate_decode,
    escape_rows,
    from_fragments,
    to_fragments,
)
from hyserve.kernels.packed_bf16 import pack_bf16, unpack_bf16
from hyserve.kernels.routed_projection.reference import project_in_reference
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _weight(n: int, k: int, seed: int = 0, escapes: bool = True) -> torch.Tensor:
    """A Gaussian bf16 weight; with ``escapes`` row 0 starts with zeros, row 3 has values far below the rest
    (several escapes in one row, more than the kernel loads ahead) and the last row one value far above."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).bfloat16()
    if escapes:
        w[0, :40] = 0.0
        w[3, 1::7] = 1e-25
        w[n - 1, 2] = 1e25
    return w


def test_fragment_map_is_the_ptx_layout():
    # PTX ISA, mma.m16n8k16 with .bf16 A: a0,a1 (row g, cols 2t, 2t+1), a2,a3 (row g+8), a4..a7 the same at cols + 8
    for lane in (0, 5, 31):
        g, t = lane // 4, lane % 4
        rows = [g, g, g + 8, g + 8, g, g, g + 8, g + 8]
        cols = [2 * t, 2 * t + 1, 2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9, 2 * t + 8, 2 * t + 9]
        assert FRAG_ROW[lane].tolist() == rows and FRAG_COL[lane].tolist() == cols
    m = torch.arange(32 * 64).reshape(32, 64)
    assert torch.equal(from_fragments(to_fragments(m)), m)
    assert to_fragments(m).shape == (2, 4, 32, 8)


@pytest.mark.parametrize("shape", [(16, 64), (48, 256), (64, 2048)])
@pytest.mark.parametrize("scale", [1.0, 1e-30, 3e30])
def test_round_trip_is_bit_exact(shape, scale):
    w = (_weight(*shape, seed=shape[0]).float() * scale).bfloat16()
    packed = pack_mma(w)
    assert torch.equal(_bits(unpack_mma(packed)), _bits(w))
    assert packed.shape == shape
    assert packed.nbytes < 0.77 * w.numel() * 2 + 16 * shape[0] + 8 * packed.escapes + 64


@pytest.mark.parametrize("at_once", [1, 16 * 256, 3 * 16 * 256])
def test_round_trip_in_tile_chunks_is_bit_exact(at_once):
    # 7 tiles of 16 rows x 256 columns: a tile at a time (at_once below one tile too), and chunks of three with a
    # shorter last one; an escape in the first and in the last tile
    w = _weight(112, 256, seed=3)
    w[2, :5] = 0.0
    w[111, 100:104] = 0.0
    packed = pack_mma(w)
    assert packed.escapes > 0
    assert torch.equal(_bits(unpack_mma(packed, elements_at_once=at_once)), _bits(w))


def test_emulated_decode_is_the_stored_bits_and_escapes_are_their_deltas():
    w = _weight(64, 256, seed=3)
    w[7, :5] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e38]).bfloat16()
    packed = pack_mma(w)
    flat = pack_bf16(w)
    # the decode without corrections is the row-major format's unpack before its escapes are written back
    plain = unpack_bf16(flat)
    e = flat.escapes
    plain[flat.escape_row[:e].long(), flat.escape_col[:e].long()] = emulate_decode(packed)[
        flat.escape_row[:e].long(), flat.escape_col[:e].long()
    ]
    assert torch.equal(_bits(emulate_decode(packed)), _bits(plain))
    assert packed.escapes == e and e >= 40
    assert torch.equal(escape_rows(packed), flat.escape_row[:e].long())
    assert torch.equal(_bits(unpack_mma(packed)), _bits(w))
    # each delta is the true value less the decoded one, exactly where the two are within 24 binades
    dec = emulate_decode(packed).float()[escape_rows(packed), packed.escape_col[:e].long()]
    true = w.float()[escape_rows(packed), packed.escape_col[:e].long()]
    near = (true != 0) & ((true.abs() / dec.abs()).log2().abs() < 20) & true.isfinite()
    assert near.any()
    assert torch.equal((dec + packed.escape_delta[:e])[near], true[near])


def test_pack_rejects_what_the_kernel_cannot_take():
    for bad in (torch.zeros(17, 64, dtype=torch.bfloat16), torch.zeros(16, 48, dtype=torch.bfloat16),
                torch.zeros(16, 64), torch.zeros(16, dtype=torch.bfloat16)):  # fmt: skip
        with pytest.raises(ValueError):
            pack_mma(bad)


def test_reference_is_the_routed_in_projection():
    w = _weight(64, 256, seed=5, escapes=False)
    x = torch.randn(1, 256).bfloat16()
    g = (torch.randn(256) * 0.1).bfloat16()
    packed = pack_mma(w)
    ref = gemv_mma_reference(x, packed, g, 1e-6, raw_from=48)
    assert torch.equal(ref, project_in_reference(x, w, 48, g, 1e-6))
    assert torch.equal(gemv_mma_reference(x, packed), x @ w.t())


def test_plans():
    assert mma_plan(12352, 2048) is not None
    assert mma_plan(12344, 2048) is None  # rows not in 16-row tiles
    plan = mma_plan(16, 2048)
    assert plan["SPLIT"] in SPLITS


def test_the_kernel_checks_its_arguments():
    packed = pack_mma(_weight(32, 2048, escapes=False))
    x = torch.randn(1, 1024).bfloat16()
    with pytest.raises(ValueError):
        gemv_mma(x, packed, {"SPLIT": 8})


gpu = pytest.mark.skipif(
    not CUDA, reason="the CUDA kernel runs on the GPU only (the CPU tests check its layout)"
)


@gpu
@pytest.mark.parametrize(
    ("n", "k", "raw_from", "norm"),
    [(12608, 2048, 12352, True), (9472, 2048, 9216, True), (12352, 2048, None, True), (2048, 4096, None, False),
     (64, 2048, 32, True), (64, 2048, 0, True)],
)  # fmt: skip
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("pdl", ["0", "1"])
def test_kernel_matches_reference(monkeypatch, n, k, raw_from, norm, split, pdl):
    if k % (128 * split):
        pytest.skip("SPLIT does not divide K")
    monkeypatch.setenv("HYSERVE_PDL", pdl)
    w = _weight(n, k, seed=n + split).to(DEVICE)
    packed = pack_mma(w)
    x = (torch.randn(1, k, device=DEVICE) * 3).bfloat16()
    g = (torch.randn(k, device=DEVICE) * 0.1).bfloat16() if norm else None
    out = torch.full((1, n), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    y = gemv_mma(x, packed, {"SPLIT": split}, norm_weight=g, norm_eps=1e-6, raw_from=raw_from, out=out)
    ref = gemv_mma_reference(x, packed, g, 1e-6, raw_from)
    assert not y.isnan().any()
    rows = torch.arange(n, device=DEVICE) != n - 1  # the 1e25 row: compared on its own
    assert rel_err(y[:, rows].float(), ref[:, rows].float()) < 4e-3
    assert rel_err(y[:, ~rows].float(), ref[:, ~rows].float()) < 4e-3


@gpu
def test_kernel_in_a_cuda_graph_repeats_itself():
    n, k = 12608, 2048
    packed = pack_mma(_weight(n, k).to(DEVICE))
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    g = (torch.randn(k, device=DEVICE) * 0.1).bfloat16()
    plan = mma_plan(n, k)
    out = torch.empty(1, n, device=DEVICE, dtype=torch.bfloat16)
    eager = gemv_mma(x, packed, plan, norm_weight=g, norm_eps=1e-6, raw_from=12352).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemv_mma(x, packed, plan, norm_weight=g, norm_eps=1e-6, raw_from=12352, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
