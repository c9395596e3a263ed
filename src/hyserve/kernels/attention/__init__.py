"""Causal attention of new query tokens over a paged KV cache (GQA), with the sigmoid output gate.

KV cache of one layer: ``k_cache, v_cache [num_blocks, block_size, Hkv, D]``. Token ``t`` of sequence
``i`` lives at flat slot ``block_tables[i, t // block_size] * block_size + t % block_size``. ``store_kv``
(in the model: ``qk_norm_rope_store``, fused with the q/k norm and RoPE) writes the new tokens' K/V first;
``paged_attention`` then reads every key of the context from the cache, so the same op serves prefill,
chunked prefill (a cached prefix) and decode.

Triton dispatch: one token per sequence (``q.shape[0] == seq_lens.shape[0]``) takes the split-K decode
kernel (no host reads: CUDA-graph safe; ``max_seq_len`` bounds its grid), anything else the varlen
prefill kernel. Launch configs come from ``configs/attention.json``. ``causal_attention`` (``causal.py``) is the
prefill of a prompt without a cached prefix, straight from its new rows.
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


def launch_config(kind: str, head_dim: int) -> dict:
    """The tile config of the ``decode`` or ``prefill`` kernel for this head_dim."""
    table = _configs()[kind]
    return dict(table.get(str(head_dim), table["default"]))


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
        _configs()[kind][str(head_dim)] = safe
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


from hyserve.kernels.attention.causal import causal_attention, causal_attention_reference  # noqa: E402

__all__ = [
    "causal_attention",
    "causal_attention_reference",
    "paged_attention",
    "paged_attention_reference",
    "store_kv",
    "store_kv_reference",
]
