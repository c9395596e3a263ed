from __future__ import annotations

import torch

from hyserve.kernels.attention.reference import store_kv_reference
from hyserve.kernels.rmsnorm.reference import rms_norm_reference


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [T, rotary_dim // 2] fp32 for integer positions [T] (frequency i = theta^(-2i/rotary_dim))."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=positions.device) / rotary_dim)
    )
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    # x: [T, H, D]; cos/sin: [T, rotary_dim // 2] -> broadcast as cat(c, c) over the rotary slice, in x's dtype
    cos = torch.cat([cos, cos], dim=-1).to(x.dtype)[:, None, :]
    sin = torch.cat([sin, sin], dim=-1).to(x.dtype)[:, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


def qk_norm_rope_reference(
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
    """q: [T, Hq, D], k: [T, Hk, D]; q_weight/k_weight: [D]; cos/sin: [P, rotary_dim // 2] fp32 tables
    (``rope_cos_sin`` of positions 0..P-1), read at the tokens' ``positions`` [T] (int, each < P).

    Returns new (q, k) of the same shapes and dtype.
    """
    cos, sin = cos[positions], sin[positions]
    q = rms_norm_reference(q, q_weight, eps)
    k = rms_norm_reference(k, k_weight, eps)
    return _rotate(q, cos, sin, rotary_dim), _rotate(k, cos, sin, rotary_dim)


def qk_norm_rope_store_reference(
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
    """``qk_norm_rope_reference`` of q, k, then ``store_kv_reference`` of the new k and the raw v [T, Hk, D]
    into k_cache/v_cache [num_blocks, block_size, Hk, D] at ``slot_mapping`` [T] (negative: not stored).

    Returns the new q [T, Hq, D]; the new k lives only in the cache.
    """
    q, k = qk_norm_rope_reference(q, k, q_weight, k_weight, eps, cos, sin, positions, rotary_dim)
    store_kv_reference(k, v, k_cache, v_cache, slot_mapping)
    return q
