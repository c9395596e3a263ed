"""paged_attention / store_kv: reference vs a float64 formula; the Triton kernels vs the reference.

On the CPU the kernels run in the Triton interpreter (small shapes, fp32/fp16); on a GPU the same tests
also run at the model's shapes (Hq=16, Hkv=2, D=256, bf16, long contexts).
"""

from __future__ import annotations

import math

import pytest
import torch

from hyserve.kernels.attention.reference import paged_attention_reference, store_kv_reference
from hyserve.kernels.attention.triton_decode import paged_decode
from hyserve.kernels.attention.triton_prefill import paged_prefill
from hyserve.kernels.attention.triton_store_kv import store_kv_triton
from hyserve.kernels.testing import rel_err
from hyserve.kernels.tickets import ticket_counters

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}
gpu_only = pytest.mark.skipif(not CUDA, reason="real shapes need a GPU")


class Batch:
    """A random paged cache holding N sequences (NaN in every slot no sequence owns) and their new queries."""

    def __init__(self, ctx, qlen, hq, hkv, d, page, dtype=torch.float32, device=DEVICE, gate=True, seed=0):
        gen = torch.Generator().manual_seed(seed)
        n_blocks = [math.ceil(c / page) for c in ctx]
        num_blocks = sum(n_blocks) + 3
        width = max(n_blocks) + 2
        self.k_cache = torch.full((num_blocks, page, hkv, d), float("nan"), dtype=dtype)
        self.v_cache = torch.full_like(self.k_cache, float("nan"))
        perm = torch.randperm(num_blocks, generator=gen)
        self.block_tables = torch.full((len(ctx), width), -1, dtype=torch.int32)
        used = 0
        slots = []
        for i, (c, nb) in enumerate(zip(ctx, n_blocks)):
            self.block_tables[i, :nb] = perm[used : used + nb].int()
            used += nb
            t = torch.arange(c)
            slots.append(self.block_tables[i, t // page].long() * page + t % page)
        slots = torch.cat(slots)
        for cache in (self.k_cache, self.v_cache):
            cache.view(-1, hkv, d)[slots] = torch.randn(len(slots), hkv, d, generator=gen).to(dtype)
        self.ctx, self.qlen, self.page = list(ctx), list(qlen), page
        total = sum(qlen)
        self.q = torch.randn(total, hq, d, generator=gen).to(dtype)
        self.gate = (2 * torch.randn(total, hq * d, generator=gen)).to(dtype) if gate else None
        self.cu_seqlens_q = torch.tensor([0, *torch.tensor(qlen).cumsum(0).tolist()], dtype=torch.int32)
        self.seq_lens = torch.tensor(ctx, dtype=torch.int32)
        self.scale = d**-0.5
        for name in ("k_cache", "v_cache", "block_tables", "q", "gate", "cu_seqlens_q", "seq_lens"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.to(device))

    def args(self):
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.cu_seqlens_q,
            self.seq_lens,
            self.block_tables,
            self.scale,
        )

    def poisoned_out(self) -> torch.Tensor:
        return torch.full_like(self.q, float("nan"))

    def formula(self) -> torch.Tensor:
        """Direct float64 attention, gathering each key through the block table one position at a time."""
        hq, hkv = self.q.shape[1], self.k_cache.shape[2]
        q, kc, vc = self.q.cpu().double(), self.k_cache.cpu().double(), self.v_cache.cpu().double()
        bt = self.block_tables.cpu()
        out = torch.zeros_like(q)
        row = 0
        for i, (c, n) in enumerate(zip(self.ctx, self.qlen)):
            keys = torch.stack([kc[bt[i, t // self.page], t % self.page] for t in range(c)])  # [c, hkv, d]
            vals = torch.stack([vc[bt[i, t // self.page], t % self.page] for t in range(c)])
            for j in range(n):
                pos = c - n + j
                for h in range(hq):
                    kv = h // (hq // hkv)
                    s = keys[: pos + 1, kv] @ q[row + j, h] * self.scale
                    out[row + j, h] = torch.softmax(s, 0) @ vals[: pos + 1, kv]
            row += n
        if self.gate is not None:
            out = out * torch.sigmoid(self.gate.cpu().double().view_as(out))
        return out


# (context lengths, query lengths): decode of a 1-token context, whole prompts, chunks over cached prefixes
MIXED = ([1, 9, 37, 20, 6], [1, 9, 5, 1, 6])
DECODE = ([1, 17, 70, 33], [1, 1, 1, 1])


@pytest.mark.parametrize("page", [4, 16])
@pytest.mark.parametrize("heads", [(6, 2), (6, 3)])
def test_reference_matches_formula(page, heads):
    for ctx, qlen in (MIXED, DECODE):
        b = Batch(ctx, qlen, *heads, 40, page, device="cpu")
        out = paged_attention_reference(*b.args(), gate=b.gate)
        assert rel_err(out, b.formula()) < 1e-6
        # a [T, Hq, D] gate view gives the same result
        out3 = paged_attention_reference(*b.args(), gate=b.gate.view(b.q.shape))
        assert torch.equal(out, out3)


CPU_CASES = [
    # hq, hkv, d, page, dtype
    (6, 2, 40, 4, torch.float32),
    (6, 3, 64, 16, torch.float32),
    (8, 1, 32, 16, torch.float16),
]


@pytest.mark.parametrize("case", CPU_CASES)
@pytest.mark.parametrize("splits", [1, 3, None])
@pytest.mark.parametrize("block_n", [16, 32])
def test_decode_kernel(case, splits, block_n):
    hq, hkv, d, page, dtype = case
    b = Batch(*DECODE, hq, hkv, d, page, dtype=dtype, gate=splits != 3)
    ref = paged_attention_reference(*b.args(), gate=b.gate)
    out = paged_decode(
        *b.args(), b.gate, max(DECODE[0]), out=b.poisoned_out(), num_splits=splits, block_n=block_n
    )
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]


# decode batches of 1 and 7 sequences: one key (the other partitions empty), many partitions, and padding rows
# (context 0: every partition empty) beside contexts that end mid-tile, on a tile edge and one past it
FUSED_CTX = [[1], [70], [0, 5, 70, 3, 64, 16, 129]]
# fused vs two kernels: the merge order's fp32 rounding, then out's (an fp16 ulp here and there)
MERGE_TOL = {torch.float32: 1e-6, torch.float16: 1e-3}


@pytest.mark.parametrize("case", CPU_CASES)
@pytest.mark.parametrize("ctx", FUSED_CTX)
@pytest.mark.parametrize("splits", [2, 5])
def test_decode_fused_reduce(case, ctx, splits):
    """The last-program merge gives the reduce kernel's result, leaves its ticket counters at zero (a CUDA-graph
    replay starts from them) and repeats exactly."""
    hq, hkv, d, page, dtype = case
    b = Batch(ctx, [1] * len(ctx), hq, hkv, d, page, dtype=dtype, gate=splits == 2)
    ref = paged_attention_reference(*b.args(), gate=b.gate)
    # fused first: its partial buffers must not be the freed ones of an identical two-kernel call, where a merge
    # reading a partition no program of its own launch wrote would still find the right values
    run = dict(out=b.poisoned_out(), num_splits=splits, block_n=16, fused_reduce=True)
    out = paged_decode(*b.args(), b.gate, max(ctx), **run)
    two = paged_decode(*b.args(), b.gate, max(ctx), out=b.poisoned_out(), num_splits=splits, block_n=16)
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]
    assert rel_err(out, two) < MERGE_TOL[dtype]
    empty = b.seq_lens == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert not ticket_counters("paged_decode", b.q.device, len(ctx) * hkv).any()
    again = paged_decode(*b.args(), b.gate, max(ctx), **{**run, "out": b.poisoned_out()})
    assert torch.equal(again, out)


@pytest.mark.parametrize("case", CPU_CASES)
def test_prefill_kernel(case):
    hq, hkv, d, page, dtype = case
    b = Batch(*MIXED, hq, hkv, d, page, dtype=dtype)
    ref = paged_attention_reference(*b.args(), gate=b.gate)
    out = paged_prefill(*b.args(), b.gate, out=b.poisoned_out(), block_m=16, block_n=16)
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]
    # the gate as the strided [T, Hq, D] half of a [T, Hq, 2D] projection
    proj = torch.cat([b.q, b.gate.view(b.q.shape)], dim=-1)
    out2 = paged_prefill(*b.args(), proj[..., d:], block_m=32, block_n=32)
    assert rel_err(out2, ref) < TOL[dtype]


@pytest.mark.parametrize("splits", [1, 3])
def test_padding_sequences(splits):
    """Decode padding rows (context 0, block table all -1) come out 0, not NaN; a prefill sequence with no
    new tokens (q_len 0) writes nothing and does not disturb its neighbours."""
    b = Batch([5, 0, 17], [1, 1, 1], 4, 2, 32, 4)
    ref = paged_attention_reference(*b.args(), gate=b.gate)
    out = paged_decode(*b.args(), b.gate, 17, out=b.poisoned_out(), num_splits=splits, block_n=16)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert rel_err(out, ref) < 1e-5
    b = Batch([9, 4, 12], [9, 0, 3], 4, 2, 32, 4)
    ref = paged_attention_reference(*b.args(), gate=b.gate)
    out = paged_prefill(*b.args(), b.gate, out=b.poisoned_out(), block_m=16, block_n=16)
    assert not out.isnan().any() and rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_kv(dtype):
    t, hkv, d, page, num_blocks = 9, 3, 40, 4, 6
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(num_blocks, page, hkv, d, generator=gen).to(dtype)
    # k as a strided view (every other head of a wider tensor), v contiguous
    k = torch.randn(t, 2 * hkv, d, generator=gen)[:, ::2].to(DEVICE)
    v = torch.randn(t, hkv, d, generator=gen).to(DEVICE)
    slots = torch.tensor([3, -1, 0, 17, 23, -1, 8, 9, 12], dtype=torch.int64, device=DEVICE)
    kc, vc = base.clone().to(DEVICE), base.clone().to(DEVICE)
    kr, vr = base.clone().to(DEVICE), base.clone().to(DEVICE)
    store_kv_triton(k, v, kc, vc, slots)
    store_kv_reference(k, v, kr, vr, slots)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    untouched = torch.ones(num_blocks * page, dtype=torch.bool)
    untouched[slots[slots >= 0].cpu()] = False
    assert torch.equal(kc.view(-1, hkv, d)[untouched.to(DEVICE)], base.view(-1, hkv, d)[untouched].to(DEVICE))


def test_dispatch(monkeypatch):
    """With the Triton path on, the public op picks decode or prefill and matches the reference."""
    import hyserve.kernels.attention as attn

    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    for ctx, qlen in (DECODE, MIXED):
        b = Batch(ctx, qlen, 4, 2, 32, 16)
        ref = paged_attention_reference(*b.args(), gate=b.gate)
        assert attn._triton_ok(b.q, b.k_cache, b.v_cache)
        assert rel_err(attn.paged_attention(*b.args(), gate=b.gate), ref) < 1e-5
    monkeypatch.setenv("HYSERVE_KERNELS", "reference")
    assert not attn._triton_ok(b.q, b.k_cache, b.v_cache)


def test_dispatch_fused_reduce(monkeypatch):
    """The decode config's keys reach paged_decode: "fused_reduce" (off in configs/attention.json) with splits;
    the fused launch is the one that allocates the ticket counters."""
    import hyserve.kernels.attention as attn
    from hyserve.kernels import tickets

    monkeypatch.setenv("HYSERVE_KERNELS", "triton")
    monkeypatch.setattr(tickets, "_COUNTERS", {})
    assert attn.launch_config("decode", 32)["fused_reduce"] is False
    config = attn._configs()["decode"]
    monkeypatch.setitem(
        config, "32", {**config["default"], "block_n": 16, "num_splits": 3, "fused_reduce": True}
    )
    b = Batch(*DECODE, 4, 2, 32, 16)
    ref = paged_attention_reference(*b.args(), gate=b.gate)
    assert rel_err(attn.paged_attention(*b.args(), gate=b.gate), ref) < 1e-5
    counters = tickets._COUNTERS[("paged_decode", str(b.q.device))]
    assert counters.numel() >= len(DECODE[0]) * 2 and not counters.any()


# ---- real shapes, GPU only -------------------------------------------------------------------------------


@gpu_only
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("page", [16, 64, 256])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_decode_real_shapes(page, batch, fused):
    gen = torch.Generator().manual_seed(batch)
    ctx = torch.randint(1, 8193, (batch,), generator=gen).tolist()
    ctx[0] = 8192
    b = Batch(ctx, [1] * batch, 16, 2, 256, page, dtype=torch.bfloat16, seed=batch)
    ref = paged_attention_reference(*b.args(), gate=b.gate)
    for max_len in (None, 8192):
        out = paged_decode(*b.args(), b.gate, max_len, out=b.poisoned_out(), fused_reduce=fused)
        assert not out.isnan().any()
        assert rel_err(out, ref) < TOL[torch.bfloat16]


@gpu_only
@pytest.mark.parametrize("page", [16, 128])
def test_prefill_real_shapes(page):
    ctx, qlen = [4096, 3000, 1500, 700, 1], [4096, 900, 1500, 1, 1]  # prompt, chunk over prefix, decode rows
    b = Batch(ctx, qlen, 16, 2, 256, page, dtype=torch.bfloat16)
    ref = paged_attention_reference(*b.args(), gate=b.gate)
    out = paged_prefill(*b.args(), b.gate, out=b.poisoned_out())
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
