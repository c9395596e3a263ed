"""The L2 prefetch option: off without PDL (the CPU interpreter), and on Hopper the pairs gate_up gives the
same bits with it as without it (a prefetch only caches)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.l2_prefetch import prefetch_parts

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def test_off_without_pdl() -> None:
    assert prefetch_parts({"L2PF": 64}, use_pdl=False) == 0
    assert prefetch_parts({"L2PF": 64}, use_pdl=True) == 64
    assert prefetch_parts({}, use_pdl=True) == 0


@pytest.mark.skipif(not HOPPER, reason="needs a GPU of compute capability >= 9 (PDL)")
@pytest.mark.parametrize("parts", [1, 7, 64, 5000])
@pytest.mark.parametrize("tokens", [1, 4])
def test_gate_up_pairs_same_bits(parts: int, tokens: int) -> None:
    from hyserve.kernels.moe.triton_pairs import gate_up_pairs

    gen = torch.Generator(device="cuda").manual_seed(parts * 10 + tokens)
    e, h, i, k = 256, 2048, 512, 8

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).bfloat16()

    x = rand(tokens, h)
    w, sw, sg = rand(e, 2 * i, h, scale=h**-0.5), rand(2 * i, h, scale=h**-0.5), rand(h, scale=h**-0.5)
    ids = torch.stack([torch.randperm(e, device="cuda", generator=gen)[:k] for _ in range(tokens)]).int()
    weights = torch.rand(tokens, k, device="cuda", generator=gen)
    cfg = {"BLOCK_I": 4, "BLOCK_K": 256, "num_warps": 4, "PREFETCH": True}
    plain = gate_up_pairs(x, w, sw, sg, ids, weights, cfg)
    hinted = gate_up_pairs(x, w, sw, sg, ids, weights, {**cfg, "L2PF": parts})
    torch.testing.assert_close(hinted, plain, rtol=0, atol=0)
