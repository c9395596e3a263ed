"""The few-token gate_up over 12-bit packed experts (``triton_pairs_packed.py``) against the bf16 kernel
(``gate_up_pairs``) on the same values: routed and shared experts, given weights or the routed projections'
raw logits with the pre-norm, experts with escapes (NaN-poisoned output)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.moe.triton_pairs import gate_up_pairs
from hyserve.kernels.moe.triton_pairs_packed import gate_up_pairs_packed
from hyserve.kernels.packed_bf16 import pack_bf16
from hyserve.kernels.testing import rel_err

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


@pytest.fixture(autouse=True)
def _triton_env(monkeypatch):
    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _inputs(T: int, E: int, H: int, I: int, top_k: int, seed: int):
    """bf16-valued weights (experts 0 and 2 with escapes: zeros, values far below the rest), x, top-k."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(E, 2 * I, H, generator=gen) * H**-0.5).bfloat16()
    w[0, :3, :20] = 0.0
    w[2, 5, ::3] = 1e-30
    sw = (torch.randn(2 * I, H, generator=gen) * H**-0.5).bfloat16()
    sw[1, :9] = 0.0
    sg = torch.randn(1, H, generator=gen) * H**-0.5
    x = torch.randn(T, H, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)]).int()
    ids[0, 0] = 0
    weights = torch.rand(T, top_k, generator=gen)
    return [t.to(DEV) for t in (w, sw, sg, x, ids, weights)]


CFGS = [
    {"BLOCK_I": 4, "BLOCK_K": 32, "num_warps": 1},
    {"BLOCK_I": 8, "BLOCK_K": 32, "num_warps": 1, "ESCAPES": 2},
]


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("norm", [False, True])
def test_packed_gate_up_matches_the_bf16_kernel(T, cfg, norm):
    E, H, I, top_k = 8, 64, 16, 3
    w, sw, sg, x, ids, weights = _inputs(T, E, H, I, top_k, seed=T * 10 + norm)
    kw = {}
    if norm:  # the routed projections' call: x before its pre-norm, the top-k raw logits
        x = x * 3.0 + 0.5
        kw = dict(norm_weight=(torch.randn(H, generator=torch.Generator().manual_seed(2)) * 0.3).to(DEV),
                  norm_eps=1e-6)  # fmt: skip
        weights = torch.randn(T, top_k, generator=torch.Generator().manual_seed(3)).to(DEV)
    bf16_cfg = {"BLOCK_I": 8, "BLOCK_K": 32}
    want = gate_up_pairs(x, w.float(), sw.float(), sg, ids, weights, bf16_cfg, **kw)
    packed, shared = pack_bf16(w.reshape(E * 2 * I, H)), pack_bf16(sw)
    assert packed.escapes > 0 and shared.escapes > 0
    h = torch.full_like(want, float("nan"))
    got = gate_up_pairs_packed(x, packed, I, shared, sg, ids, weights, cfg, h, **kw)
    assert got is h and not got.isnan().any()
    assert rel_err(got, want) < 1e-5


def test_without_a_shared_expert():
    E, H, I, top_k = 8, 64, 16, 2
    w, _, _, x, ids, weights = _inputs(2, E, H, I, top_k, seed=5)
    want = gate_up_pairs(x, w.float(), None, None, ids, weights, {"BLOCK_I": 8, "BLOCK_K": 32})
    got = gate_up_pairs_packed(x, pack_bf16(w.reshape(E * 2 * I, H)), I, None, None, ids, weights, CFGS[0])
    assert rel_err(got[: 2 * top_k], want[: 2 * top_k]) < 1e-5


def test_contracts():
    E, H, I = 8, 64, 16
    w, sw, sg, x, ids, weights = _inputs(1, E, H, I, 2, seed=6)
    packed = pack_bf16(w.reshape(E * 2 * I, H))
    with pytest.raises(ValueError, match="multiple of BLOCK_I"):
        gate_up_pairs_packed(x, packed, I, None, None, ids, weights, {"BLOCK_I": 5, "BLOCK_K": 32})
    with pytest.raises(ValueError, match="multiple of BLOCK_K"):
        gate_up_pairs_packed(x, packed, I, None, None, ids, weights, {"BLOCK_I": 4, "BLOCK_K": 48})
    with pytest.raises(ValueError, match=r"\[2I, H\]"):
        gate_up_pairs_packed(x, packed, I, pack_bf16(sw[:8]), sg, ids, weights, CFGS[0])


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize(
    "cfg", [{"BLOCK_I": 16, "num_warps": 1}, {"BLOCK_I": 8, "num_warps": 1, "ESCAPES": 1}]
)
def test_packed_down_matches_the_bf16_kernel(T, shared, cfg):
    from hyserve.kernels.moe.triton_pairs import down_pairs
    from hyserve.kernels.moe.triton_pairs_packed import down_pairs_packed

    E, H, I, top_k = 8, 24, 32, 3
    gen = torch.Generator().manual_seed(T + 10 * shared)
    wd = (torch.randn(E, H, I, generator=gen) * I**-0.5).bfloat16()
    wd[0, :2, :10] = 0.0  # escapes: zeros and values far below the rest, several in one row
    wd[3, 4, ::3] = 1e-30
    swd = (torch.randn(H, I, generator=gen) * I**-0.5).bfloat16()
    swd[2, :5] = 0.0
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)]).int()
    ids[0, :2] = torch.tensor([0, 3])
    h = torch.randn(T * top_k + T, I, generator=gen)
    resid = torch.randn(T, H, generator=gen)
    wd, swd, ids, h, resid = (x.to(DEV) for x in (wd, swd, ids, h, resid))
    sd = swd.float() if shared else None
    want = down_pairs(h, wd.float(), sd, ids, {"BLOCK_H": 8, "BLOCK_I": 16}, out=resid.clone(), add_out=True)
    packed = pack_bf16(wd.reshape(E * H, I))
    assert packed.escapes > 10
    sp = pack_bf16(swd) if shared else None
    extra = {} if shared else {"H": H}
    got = down_pairs_packed(h, packed, sp, ids, {**cfg, **extra}, out=resid.clone(), add_out=True)
    assert not got.isnan().any()
    assert rel_err(got - resid, want - resid) < 1e-5
