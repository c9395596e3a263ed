"""mma_experts: the experts' fragment-ordered copies give back every gate_up and down bit (CPU); the kernels over
them are tested in ``test_mma_grouped.py`` (GPU)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.moe.mma_experts import pack_mma_experts, unpack_mma_down, unpack_mma_experts

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _experts(e: int, inter: int, hidden: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(e, 2 * inter, hidden, generator=gen) * hidden**-0.5).bfloat16()
    shared = (torch.randn(2 * inter, hidden, generator=gen) * hidden**-0.5).bfloat16()
    w[1, 3, :9] = 0.0  # escapes
    sg = (torch.randn(1, hidden, generator=gen) * hidden**-0.5).bfloat16()
    return w.to(DEVICE), shared.to(DEVICE), sg.to(DEVICE)


def test_round_trip_is_bit_exact():
    w, shared, _ = _experts(4, 32, 128)
    packed = pack_mma_experts(w, shared)
    w2, shared2 = unpack_mma_experts(packed)
    assert torch.equal(w2.view(torch.int16), w.view(torch.int16))
    assert torch.equal(shared2.view(torch.int16), shared.view(torch.int16))
    assert packed.num_experts == 4 and packed.inter == 32


def test_down_round_trip_is_bit_exact():
    w, shared, _ = _experts(3, 64, 128, seed=4)
    gen = torch.Generator().manual_seed(4)
    wd = (torch.randn(3, 128, 64, generator=gen) * 0.125).bfloat16().to(DEVICE)
    sd = (torch.randn(128, 64, generator=gen) * 0.125).bfloat16().to(DEVICE)
    wd[1, 5, :7] = 0.0  # escapes
    wd2, sd2 = unpack_mma_down(pack_mma_experts(w, shared, wd, sd))
    assert torch.equal(wd2.view(torch.int16), wd.view(torch.int16))
    assert torch.equal(sd2.view(torch.int16), sd.view(torch.int16))


def test_pack_rejects_bad_shapes():
    w, shared, _ = _experts(2, 32, 128)
    with pytest.raises(ValueError):
        pack_mma_experts(w, shared[:32])
    with pytest.raises(ValueError):
        pack_mma_experts(w.float(), shared)
    with pytest.raises(ValueError):
        pack_mma_experts(w, shared, w[:, :, :32], shared[:, :32])
