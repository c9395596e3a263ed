"""decode_attention: the split kernel with the q/k norm, RoPE and KV store inside (``triton_decode_qk``) against
the two kernels it replaces (``qk_norm_rope_store`` then ``paged_decode``: the same bits, output and cache) and
against the references; the op's dispatch on the decode config's ``fused_qk``.

q, k, v are the strided views of one projection output, as the model passes them; the cache holds random old
keys (NaN where no sequence owns a slot); one row has a negative slot (a padding row: nothing stored, its
attention reads what the slot held)."""

from __future__ import annotations

import pytest
import torch

from hyserve.kernels.attention import decode_attention
from hyserve.kernels.attention.reference import paged_attention_reference
from hyserve.kernels.attention.test_attention import CUDA, DEVICE, TOL, Batch
from hyserve.kernels.attention.triton_decode import paged_decode
from hyserve.kernels.attention.triton_decode_qk import paged_decode_qk
from hyserve.kernels.qk_norm_rope.reference import qk_norm_rope_store_reference, rope_cos_sin
from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_store_triton
from hyserve.kernels.testing import rel_err


def _new_tokens(b: Batch, hq: int, hkv: int, d: int, rot: int, pad_row: int | None, seed: int = 1):
    """The projection's q (the first half of each [query | gate] head), gate, k and v [N, H, D] views, the q/k
    norm weights, the RoPE tables, positions (ctx - 1) and the new tokens' slots."""
    gen = torch.Generator().manual_seed(seed)
    n, dtype = len(b.ctx), b.q.dtype
    proj = torch.randn(n, hq * 2 * d + 2 * hkv * d, generator=gen).to(dtype).to(DEVICE)
    qg = proj[:, : hq * 2 * d].view(n, hq, 2 * d)
    kv = proj[:, hq * 2 * d :]
    q, gate = qg[..., :d], qg[..., d:]
    k, v = kv[:, : hkv * d].view(n, hkv, d), kv[:, hkv * d :].view(n, hkv, d)
    qw, kw = (
        (0.1 * torch.randn(d, generator=gen)).to(dtype).to(DEVICE),
        torch.zeros(d, dtype=dtype, device=DEVICE),
    )
    cos, sin = rope_cos_sin(torch.arange(max(b.ctx) + 4, device=DEVICE), rot, 10000.0)
    pos = (b.seq_lens - 1).long()
    slots = b.block_tables[torch.arange(n, device=DEVICE), pos // b.page].long() * b.page + pos % b.page
    if pad_row is not None:
        slots[pad_row] = -1
    return q, gate, k, v, qw, kw, cos, sin, pos, slots


CASES = [
    # hq, hkv, d, page, rotary dim, dtype
    (6, 2, 40, 4, 16, torch.float32),
    (8, 1, 32, 16, 32, torch.float16),
]
if CUDA:
    CASES += [(16, 2, 256, 16, 64, torch.bfloat16)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("splits,fused_reduce", [(1, False), (3, False), (3, True)])
def test_fused_kernel_is_the_two_kernels(case, splits, fused_reduce):
    hq, hkv, d, page, rot, dtype = case
    ctx = [1, 17, 70, 33]
    b = Batch(ctx, [1] * len(ctx), hq, hkv, d, page, dtype=dtype, gate=False)
    q, gate, k, v, qw, kw, cos, sin, pos, slots = _new_tokens(b, hq, hkv, d, rot, pad_row=2)
    run = dict(num_splits=splits, block_n=16, fused_reduce=fused_reduce)
    attend = (b.cu_seqlens_q, b.seq_lens, b.block_tables, b.scale, gate, max(ctx))

    kc1, vc1 = b.k_cache.clone(), b.v_cache.clone()
    qn = qk_norm_rope_store_triton(q, k, v, qw, kw, 1e-6, cos, sin, pos, rot, kc1, vc1, slots)
    two = paged_decode(qn, kc1, vc1, *attend, out=torch.full_like(qn, float("nan")), **run)

    kc2, vc2 = b.k_cache.clone(), b.v_cache.clone()
    one = paged_decode_qk(
        q, k, v, qw, kw, 1e-6, cos, sin, pos, rot, kc2, vc2, slots, *attend,
        out=torch.full_like(qn, float("nan")), **run,
    )  # fmt: skip
    assert not one.isnan().any()
    assert torch.equal(one, two)
    assert torch.equal(kc2.nan_to_num(7.0), kc1.nan_to_num(7.0))
    assert torch.equal(vc2.nan_to_num(7.0), vc1.nan_to_num(7.0))

    kc3, vc3 = b.k_cache.clone(), b.v_cache.clone()
    qr = qk_norm_rope_store_reference(q, k, v, qw, kw, 1e-6, cos, sin, pos, rot, kc3, vc3, slots)
    ref = paged_attention_reference(qr, kc3, vc3, *attend)
    assert rel_err(one, ref) < TOL[dtype]


@pytest.mark.parametrize("fused_qk", [False, True])
def test_dispatch(fused_qk, monkeypatch):
    """The op takes the fused kernel where the decode config asks for it, else the two ops; both give the
    reference's result, and the fused one the two kernels' bits."""
    import hyserve.kernels.attention as attn

    hq, hkv, d, page, rot = 6, 2, 40, 4, 16
    ctx = [5, 23]
    b = Batch(ctx, [1] * len(ctx), hq, hkv, d, page, gate=False)
    q, gate, k, v, qw, kw, cos, sin, pos, slots = _new_tokens(b, hq, hkv, d, rot, pad_row=None)
    config = attn._configs()["decode"]
    monkeypatch.setitem(config, str(d), {**config["default"], "block_n": 16, "fused_qk": fused_qk})
    calls = []
    real = attn._launch
    monkeypatch.setattr(attn, "_launch", lambda kind, fn, *a: calls.append(fn.__name__) or real(kind, fn, *a))
    outs = {}
    for kernels in ("triton", "reference"):
        monkeypatch.setenv("HYSERVE_KERNELS", kernels)
        kc, vc = b.k_cache.clone(), b.v_cache.clone()
        outs[kernels] = decode_attention(
            q, k, v, qw, kw, 1e-6, cos, sin, pos, rot, kc, vc, slots, b.cu_seqlens_q, b.seq_lens, b.block_tables,
            b.scale, gate,
        )  # fmt: skip
    assert calls[0] == ("paged_decode_qk" if fused_qk else "paged_decode")
    assert rel_err(outs["triton"], outs["reference"]) < 1e-5
