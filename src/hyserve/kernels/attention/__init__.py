"""Causal attention of new query tokens over a paged KV cache (GQA), with the sigmoid output gate.

KV cache of one layer: ``k_cache, v_cache [num_blocks, block_size, Hkv, D]``. Token ``t`` of sequence
``i`` lives at flat slot ``block_tables[i, t // block_size] * block_size + t % block_size``. ``store_kv``
(in the model: ``qk_norm_rope_store``, fused with the q/k norm and RoPE) writes the new tokens' K/V first;
``paged_attention`` then reads every key of the context from the cache, so the same op serves prefill,
chunked prefill (a cached prefix) and decode.

Triton dispatch: one token per sequence (``q.shape[0] == seq_lens.shape[0]``) takes the split-K decode
kernel (no host reads: CUDA-graph safe; ``max_seq_len`` bounds its grid), anything else the varlen
prefill kernel. Launch configs come from ``configs/attention.json``. ``causal_attention`` (``causal.py``) is the
prefill of a prompt without a cached prefix, straight from its new rows; ``decode_attention`` the decode step's
whole attention from the qkv projection (the q/k norm, RoPE and KV store, then the paged decode).
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import torch

from hyserve.kernels.attention.reference import paged_attention_reference, store_kv_reference
from hyserve.kernels.dispatch import triton_enabled

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.cache
def _configs() -> dict:
    return json.loads((Path(__file__).parent / "configs" / "attention.json").read_text())


def _entry(kind: str, head_dim: int) -> dict:
    table = _configs()[kind]
    return table.get(str(head_dim), table["default"])


def launch_config(kind: str, head_dim: int) -> dict:
    """The tile config of the ``decode`` or ``prefill`` kernel for this head_dim (the kernel's keyword
    arguments: without the decode entry's ``fused_qk``, which picks the kernel)."""
    config = dict(_entry(kind, head_dim))
    config.pop("fused_qk", None)
    return config


def fused_qk(head_dim: int) -> bool:
    """The decode entry's ``fused_qk``: ``decode_attention`` as one kernel (``triton_decode_qk.py``)."""
    return bool(_entry("decode", head_dim).get("fused_qk", False))


_SAFE = {
    "decode": {"block_n": 32, "num_warps": 4, "num_stages": 1},
    "prefill": {"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 1},
}


def _launch(kind: str, fn, *args):
    """Run ``fn`` with the configured tiles; if they do not fit (shared memory), fall back to small ones
    for this head_dim from then on (the first call compiles, outside any CUDA-graph capture)."""
    from triton import OutOfResources

    head_dim = args[0].shape[2]
    config = launch_config(kind, head_dim)
    try:
        return fn(*args, **config)
    except OutOfResources as e:
        safe = {**config, **_SAFE[kind]}
        warnings.warn(f"attention {kind} config {config} does not fit ({e}); using {safe}", stacklevel=3)
        _configs()[kind][str(head_dim)] = {**_entry(kind, head_dim), **_SAFE[kind]}  # keeps fused_qk
        return fn(*args, **safe)


def _triton_ok(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *rest: torch.Tensor) -> bool:
    return (
        triton_enabled(q, k_cache, v_cache, *rest)
        and q.dtype in _DTYPES
        and k_cache.dtype == q.dtype
        and v_cache.dtype == q.dtype
        and k_cache.stride(-1) == 1
        and v_cache.stride(-1) == 1
        and q.shape[1] % k_cache.shape[2] == 0
    )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """See ``paged_attention_reference``; ``gate`` may also be the [T, Hq, D] strided view of q_proj's output.

    ``max_seq_len`` (optional host int >= every seq_len) lets the decode kernel size its split-K grid from
    the real maximum context instead of ``block_tables.shape[1] * block_size``.
    """
    if _triton_ok(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables):
        if q.stride(-1) != 1:
            q = q.contiguous()
        if gate is not None and gate.stride(-1) != 1:
            gate = gate.contiguous()
        args = (q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, gate)
        if q.shape[0] == seq_lens.shape[0]:
            from hyserve.kernels.attention.triton_decode import paged_decode

            return _launch("decode", paged_decode, *args, max_seq_len)
        from hyserve.kernels.attention.triton_prefill import paged_prefill

        return _launch("prefill", paged_prefill, *args)
    return paged_attention_reference(
        q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, gate, max_seq_len
    )


def decode_attention(
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
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new token per sequence, from the qkv projection's q, k, v [N, H, D] views: ``qk_norm_rope_store``
    (its arguments up to ``slot_mapping``), then ``paged_attention`` of the normed, rotated q -> [N, Hq, D].
    With the decode config's ``fused_qk`` (configs/attention.json) one Triton kernel does both
    (``triton_decode_qk.py``; the same bits)."""
    from hyserve.kernels.qk_norm_rope import qk_norm_rope_store, store_triton_ok

    store = (q_weight, k_weight, eps, cos, sin, positions, rotary_dim, k_cache, v_cache, slot_mapping)
    attend = (cu_seqlens_q, seq_lens, block_tables, scale, gate)
    if (
        fused_qk(q.shape[2])
        and q.shape[0] == seq_lens.shape[0]
        and _triton_ok(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables)
        and store_triton_ok(
            q, k, v, q_weight, k_weight, cos, sin, positions, rotary_dim, k_cache, v_cache, slot_mapping
        )
    ):
        from hyserve.kernels.attention.triton_decode_qk import paged_decode_qk

        if gate is not None and gate.stride(-1) != 1:
            gate = gate.contiguous()
        return _launch(
            "decode", paged_decode_qk, q, k, v, *store, cu_seqlens_q, seq_lens, block_tables, scale, gate
        )
    q = qk_norm_rope_store(q, k, v, *store)
    return paged_attention(q, k_cache, v_cache, *attend)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """See ``store_kv_reference``: k, v [T, Hkv, D] into the cache slots ``slot_mapping`` (negative: skipped)."""
    if (
        triton_enabled(k, v, k_cache, v_cache, slot_mapping)
        and k_cache.dtype in _DTYPES
        and k_cache.stride(-1) == 1
        and v_cache.stride(-1) == 1
    ):
        from hyserve.kernels.attention.triton_store_kv import store_kv_triton

        store_kv_triton(k, v, k_cache, v_cache, slot_mapping)
        return
    store_kv_reference(k, v, k_cache, v_cache, slot_mapping)


from hyserve.kernels.attention.causal import (  # noqa: E402
    causal_attention,
    causal_attention_reference,
    graph_backend,
)

__all__ = [
    "causal_attention",
    "causal_attention_reference",
    "decode_attention",
    "graph_backend",
    "paged_attention",
    "paged_attention_reference",
    "store_kv",
    "store_kv_reference",
]
