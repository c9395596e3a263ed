"""Micro-benchmark of qk_norm_rope at the attention shape (q 16 x 256 as a view of [T, 16, 512], k 2 x 256,
rotary 64, bf16), and of qk_norm_rope_store against the two launches it replaces (qk_norm_rope, store_kv).

``python -m hyserve.kernels.qk_norm_rope.bench``: time (CUDA-graph replay, median), bytes moved, GB/s and
% of 4.0 TB/s, with the torch reference (qk_norm_rope) or the two Triton launches (qk_norm_rope_store)
beside.
"""

from __future__ import annotations

import torch

from hyserve.kernels.attention.triton_store_kv import store_kv_triton
from hyserve.kernels.qk_norm_rope.reference import qk_norm_rope_reference, rope_cos_sin
from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_store_triton, qk_norm_rope_triton
from hyserve.kernels.rmsnorm.bench import DEVICE, DTYPE, HBM, Cycle, copies_for, time_ms

PAGE = 16


def bench(tokens: int, hq: int = 16, hk: int = 2, dim: int = 256, rot: int = 64) -> dict:
    io = 2 * tokens * (hq + hk) * dim * 2 + 2 * tokens * (rot // 2) * 4
    qw = torch.randn(dim, device=DEVICE, dtype=DTYPE)
    kw = torch.randn(dim, device=DEVICE, dtype=DTYPE)
    positions = torch.arange(tokens, device=DEVICE)
    cos, sin = rope_cos_sin(positions, rot, 1e7)
    inputs = []
    for _ in range(copies_for(io)):
        q = torch.randn(tokens, hq, 2 * dim, device=DEVICE, dtype=DTYPE)[..., :dim]
        k = torch.randn(tokens, hk, dim, device=DEVICE, dtype=DTYPE)
        inputs.append((q, k, qw, kw, 1e-6, cos, sin, positions, rot))
    ms = time_ms(Cycle(qk_norm_rope_triton, inputs))
    ref = time_ms(Cycle(qk_norm_rope_reference, inputs))
    return dict(
        op="qk_norm_rope",
        T=tokens,
        us=ms * 1e3,
        GBps=io / ms / 1e6,
        pct_hbm=100 * io / (ms * 1e-3) / HBM,
        ref_us=ref * 1e3,
    )


def _two_launches(q, k, v, qw, kw, eps, cos, sin, positions, rot, k_cache, v_cache, slots) -> torch.Tensor:
    """What qk_norm_rope_store replaces: the norm/rope kernel, then the store kernel reading its k back."""
    q, k = qk_norm_rope_triton(q, k, qw, kw, eps, cos, sin, positions, rot)
    store_kv_triton(k, v, k_cache, v_cache, slots)
    return q


def bench_store(tokens: int, hq: int = 16, hk: int = 2, dim: int = 256, rot: int = 64) -> dict:
    """q, k, v as the model's views of one qkv projection; distinct random slots of a bf16 paged cache."""
    # q, k, v in; q out; k, v into the cache; the cos/sin rows
    io = tokens * (2 * hq + 4 * hk) * dim * 2 + 2 * tokens * (rot // 2) * 4
    qw = torch.randn(dim, device=DEVICE, dtype=DTYPE)
    kw = torch.randn(dim, device=DEVICE, dtype=DTYPE)
    positions = torch.arange(tokens, device=DEVICE)
    cos, sin = rope_cos_sin(positions, rot, 1e7)
    num_blocks = (tokens + PAGE - 1) // PAGE
    inputs = []
    for _ in range(copies_for(io)):
        proj = torch.randn(tokens, (2 * hq + 2 * hk) * dim, device=DEVICE, dtype=DTYPE)
        q_gate, k, v = proj.split([2 * hq * dim, hk * dim, hk * dim], dim=-1)
        q = q_gate.view(tokens, hq, 2 * dim)[..., :dim]
        k_cache = torch.zeros(num_blocks, PAGE, hk, dim, device=DEVICE, dtype=DTYPE)
        v_cache = torch.zeros_like(k_cache)
        slots = torch.randperm(num_blocks * PAGE, device=DEVICE)[:tokens]
        kv = (k.view(tokens, hk, dim), v.view(tokens, hk, dim))
        inputs.append((q, *kv, qw, kw, 1e-6, cos, sin, positions, rot, k_cache, v_cache, slots))
    ms = time_ms(Cycle(qk_norm_rope_store_triton, inputs))
    two = time_ms(Cycle(_two_launches, inputs))
    return dict(
        op="qk_norm_rope_store",
        T=tokens,
        us=ms * 1e3,
        GBps=io / ms / 1e6,
        pct_hbm=100 * io / (ms * 1e-3) / HBM,
        two_launches_us=two * 1e3,
    )


def run() -> list[dict]:
    sizes = (1, 32, 256, 4096, 16384)
    return [bench(t) for t in sizes] + [bench_store(t) for t in sizes]


def main() -> None:
    for r in run():
        print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
