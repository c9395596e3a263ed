"""The decode split kernel with the q/k-norm + RoPE + KV-store prologue (``triton_decode_rope.py``) against the
two launches it replaces (``qk_norm_rope_store`` then ``paged_decode``: the same bits in the interpreter) and
against the references (``qk_norm_rope_store_reference`` then ``paged_attention_reference``), with NaN in the
new token's cache slot and in the output before the call. On a GPU also at the model's shapes."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.attention.reference import paged_attention_reference
from hyserve.kernels.attention.test_attention import CUDA, DEVICE, TOL, Batch, _rel
from hyserve.kernels.attention.triton_decode import paged_decode
from hyserve.kernels.attention.triton_decode_rope import paged_decode_rope
from hyserve.kernels.qk_norm_rope.reference import qk_norm_rope_store_reference, rope_cos_sin
from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_store_triton
from hyserve.kernels.tickets import ticket_counters

gpu_only = pytest.mark.skipif(not CUDA, reason="real shapes need a GPU")
EPS = 1e-6


class RopeBatch(Batch):
    """``Batch`` whose new tokens arrive raw: q as the first half of each head of a [N, Hq, 2D] projection (the
    other half the gate), k and v as views of one [N, 2 * Hkv * D] tensor, the new token's cache slot NaN."""

    def __init__(self, ctx, hq, hkv, d, page, rot, dtype=torch.float32, seed=0):
        super().__init__(ctx, [1] * len(ctx), hq, hkv, d, page, dtype=dtype, gate=False, seed=seed)
        gen = torch.Generator().manual_seed(seed + 1)
        n = len(ctx)
        proj = (2 * torch.randn(n, hq, 2 * d, generator=gen)).to(dtype).to(DEVICE)
        self.q, self.gate = proj[..., :d], proj[..., d:]
        kv = torch.randn(n, 2 * hkv * d, generator=gen).to(dtype).to(DEVICE)
        self.k, self.v = kv[:, : hkv * d].view(n, hkv, d), kv[:, hkv * d :].view(n, hkv, d)
        self.qw = (0.3 * torch.randn(d, generator=gen)).to(dtype).to(DEVICE)
        self.kw = (0.3 * torch.randn(d, generator=gen)).to(dtype).to(DEVICE)
        self.cos, self.sin = rope_cos_sin(torch.arange(max(ctx) + 1, device=DEVICE), rot, 1e7)
        self.rot = rot
        positions = torch.tensor([max(c - 1, 0) for c in ctx])
        bt = self.block_tables.cpu().long()
        slots = [
            int(bt[i, p // page]) * page + p % page if c > 0 else -1
            for i, (c, p) in enumerate(zip(ctx, positions))
        ]
        self.positions = positions.to(DEVICE)
        self.slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
        live = self.slot_mapping[self.slot_mapping >= 0]
        for cache in (self.k_cache, self.v_cache):
            cache.view(-1, hkv, d)[live] = float("nan")

    def rope_args(self):
        return (self.qw, self.kw, EPS, self.cos, self.sin, self.positions, self.rot)

    def caches(self):
        return self.k_cache.clone(), self.v_cache.clone()

    def attend_args(self, k_cache, v_cache):
        return (
            k_cache,
            v_cache,
            self.slot_mapping,
            self.cu_seqlens_q,
            self.seq_lens,
            self.block_tables,
            self.scale,
        )

    def two_ops(self, reference, **run):
        """(out, k_cache, v_cache) of the two launches (or the two references)."""
        kc, vc = self.caches()
        store = qk_norm_rope_store_reference if reference else qk_norm_rope_store_triton
        q = store(self.q, self.k, self.v, *self.rope_args(), kc, vc, self.slot_mapping)
        args = (q, kc, vc, self.cu_seqlens_q, self.seq_lens, self.block_tables, self.scale)
        if reference:
            return paged_attention_reference(*args, gate=self.gate), kc, vc
        return (
            paged_decode(*args, self.gate, max(self.ctx), out=torch.full_like(q, float("nan")), **run),
            kc,
            vc,
        )

    def fused(self, **run):
        kc, vc = self.caches()
        out = paged_decode_rope(
            self.q, self.k, self.v, *self.rope_args(), *self.attend_args(kc, vc), self.gate, max(self.ctx),
            out=torch.full(self.q.shape, float("nan"), dtype=self.q.dtype, device=DEVICE), **run,
        )  # fmt: skip
        return out, kc, vc


CPU_CASES = [
    # hq, hkv, d, page, rotary dims, dtype
    (6, 2, 32, 4, 16, torch.float32),
    (8, 1, 64, 16, 64, torch.float16),
]
# one key, a context ending mid-tile, on a tile edge, one past it, and a padding row (context 0, slot -1)
CTX = [[1], [70], [5, 0, 64, 17, 33]]


@pytest.mark.parametrize("case", CPU_CASES)
@pytest.mark.parametrize("ctx", CTX)
@pytest.mark.parametrize(
    "run", [dict(num_splits=1), dict(num_splits=3), dict(num_splits=3, fused_reduce=True)]
)
def test_matches_two_launches(case, ctx, run):
    hq, hkv, d, page, rot, dtype = case
    b = RopeBatch(ctx, hq, hkv, d, page, rot, dtype=dtype)
    run = dict(run, block_n=16)
    out, kc, vc = b.fused(**run)
    two, kc2, vc2 = b.two_ops(reference=False, **run)
    ref, kcr, vcr = b.two_ops(reference=True)
    assert not out.isnan().any()
    assert torch.equal(out, two)
    # the caches: the new rows written (in the interpreter the same bits as the store kernel's; on a GPU the norm's
    # sum may round in another order, visible in fp32), every other slot untouched (NaN stays NaN)
    assert torch.equal(kc.isnan(), kc2.isnan()) and torch.equal(vc.nan_to_num(7.0), vc2.nan_to_num(7.0))
    assert _rel(kc.nan_to_num(0.0), kc2.nan_to_num(0.0)) < (TOL[dtype] if CUDA else 0.0) or torch.equal(
        kc.nan_to_num(7.0), kc2.nan_to_num(7.0)
    )
    assert _rel(out, ref) < TOL[dtype]
    assert _rel(kc.nan_to_num(0.0), kcr.nan_to_num(0.0)) < TOL[dtype]
    pad = b.seq_lens == 0
    assert torch.equal(out[pad], torch.zeros_like(out[pad]))
    if run.get("fused_reduce"):
        assert not ticket_counters("paged_decode", b.q.device, len(ctx) * hkv).any()


def test_dispatch(monkeypatch):
    """The op takes the one launch for a decode batch with ``rope_prologue`` on, the two ops otherwise (off, or
    a prefill batch), all matching the references."""
    import hyserve.kernels.attention as attn
    import hyserve.kernels.attention.triton_decode_rope as rope_mod

    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    calls = []
    real = rope_mod.paged_decode_rope
    monkeypatch.setattr(rope_mod, "paged_decode_rope", lambda *a, **k: calls.append(1) or real(*a, **k))
    config = attn._configs()["decode"]
    b = RopeBatch([5, 40, 17], 4, 2, 32, 16, 16)
    ref = b.two_ops(reference=True)[0]
    for on in (True, False):
        monkeypatch.setitem(config, "32", {**config["default"], "block_n": 16, "rope_prologue": on})
        kc, vc = b.caches()
        out = attn.qk_norm_rope_attention(b.q, b.k, b.v, *b.rope_args(), *b.attend_args(kc, vc), gate=b.gate)
        assert _rel(out, ref) < 1e-5
        assert len(calls) == 1  # the first (on) call only
    # a prefill batch (two new tokens of one sequence) never takes it
    monkeypatch.setitem(config, "32", {**config["default"], "block_n": 16, "rope_prologue": True})
    kc, vc = b.caches()
    cu = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEVICE)
    attn.qk_norm_rope_attention(b.q, b.k, b.v, *b.rope_args(), kc, vc, b.slot_mapping, cu, b.seq_lens[:2],
                                b.block_tables[:2], b.scale, gate=b.gate)  # fmt: skip
    assert len(calls) == 1


@gpu_only
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_real_shapes(batch, fused):
    gen = torch.Generator().manual_seed(batch)
    ctx = torch.randint(1, 8193, (batch,), generator=gen).tolist()
    ctx[0] = 8192
    b = RopeBatch(ctx, 16, 2, 256, 16, 64, dtype=torch.bfloat16, seed=batch)
    out, kc, _ = b.fused(fused_reduce=fused)
    two, kc2, _ = b.two_ops(reference=False, fused_reduce=fused)
    ref, kcr, _ = b.two_ops(reference=True)
    assert not out.isnan().any()
    assert _rel(out, ref) < TOL[torch.bfloat16]
    # the q norm's sum may round in another order than the store kernel's: a bf16 ulp of q here and there
    assert _rel(out, two) < 2e-3
    assert _rel(kc.nan_to_num(0.0), kcr.nan_to_num(0.0)) < TOL[torch.bfloat16]
