"""Per-head q/k RMSNorm (zero-centred) followed by partial NeoX rotary on the first ``rotary_dim`` dims;
``qk_norm_rope_store`` also writes the new k and v into the paged KV cache.

Triton (``triton_kernel.py``, one kernel per op, reading q/k/v as strided views) for fp16/bf16/fp32 with
an even rotary_dim <= head_dim; else the reference (``qk_norm_rope_store``: the two ops
``qk_norm_rope`` and ``store_kv``).
"""

from __future__ import annotations

import torch

from hyserve.kernels.attention import store_kv
from hyserve.kernels.dispatch import triton_enabled
from hyserve.kernels.qk_norm_rope.reference import (
    qk_norm_rope_reference,
    qk_norm_rope_store_reference,
    rope_cos_sin,
)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _triton_ok(q: torch.Tensor, k: torch.Tensor, rotary_dim: int, *rest: torch.Tensor) -> bool:
    return (
        triton_enabled(q, k, *rest)
        and q.dtype in _DTYPES
        and k.dtype == q.dtype
        and q.shape[2] == k.shape[2]
        and 0 < rotary_dim <= q.shape[2]
        and rotary_dim % 2 == 0
    )


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    rotary_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``qk_norm_rope_reference``: q [T, Hq, D], k [T, Hk, D], the cos/sin tables read at ``positions``
    [T] -> new (q, k)."""
    if _triton_ok(q, k, rotary_dim, q_weight, k_weight, cos, sin, positions):
        from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_triton

        return qk_norm_rope_triton(q, k, q_weight, k_weight, eps, cos, sin, positions, rotary_dim)
    return qk_norm_rope_reference(q, k, q_weight, k_weight, eps, cos, sin, positions, rotary_dim)


def store_triton_ok(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    rotary_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> bool:
    """Whether the Triton q/k norm + RoPE + KV store (``qk_norm_rope_store``, or inside the decode attention
    kernel: ``attention.decode_attention``) takes these operands."""
    return (
        _triton_ok(
            q, k, rotary_dim, v, q_weight, k_weight, cos, sin, positions, k_cache, v_cache, slot_mapping
        )
        and v.shape == k.shape
        and k_cache.shape[2:] == k.shape[1:]
        and v_cache.shape[2:] == v.shape[1:]
        and k_cache.dtype == q.dtype
        and v_cache.dtype == q.dtype
        and k_cache.stride(-1) == 1
        and v_cache.stride(-1) == 1
    )


def qk_norm_rope_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    rotary_dim: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """See ``qk_norm_rope_store_reference``: ``qk_norm_rope`` of q [T, Hq, D], k [T, Hk, D], the new k and
    the raw v [T, Hk, D] into k_cache/v_cache [num_blocks, block_size, Hk, D] at ``slot_mapping`` [T]
    (negative: not stored) -> the new q. One kernel; CUDA-graph safe (no host reads)."""
    if store_triton_ok(
        q, k, v, q_weight, k_weight, cos, sin, positions, rotary_dim, k_cache, v_cache, slot_mapping
    ):
        from hyserve.kernels.qk_norm_rope.triton_kernel import qk_norm_rope_store_triton

        return qk_norm_rope_store_triton(
            q, k, v, q_weight, k_weight, eps, cos, sin, positions, rotary_dim, k_cache, v_cache, slot_mapping
        )
    q, k = qk_norm_rope(q, k, q_weight, k_weight, eps, cos, sin, positions, rotary_dim)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


__all__ = [
    "qk_norm_rope",
    "qk_norm_rope_reference",
    "qk_norm_rope_store",
    "qk_norm_rope_store_reference",
    "rope_cos_sin",
    "store_triton_ok",
]
