from __future__ import annotations

import torch


def store_kv_reference(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: [T, Hkv, D] -> cache slots ``slot_mapping`` [T] (int64; negative = padding, not stored)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep].to(v_cache.dtype)


def paged_attention_reference(
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
    """q: [T, Hq, D] (the new tokens of N sequences, packed); cu_seqlens_q: [N+1]; seq_lens: [N] context
    length including the new tokens; block_tables: [N, max_blocks]. The j-th new token of sequence i sits at
    position ``seq_lens[i] - q_len_i + j`` and sees keys 0..that position. Softmax in fp32.
    gate: [T, Hq * D] (or [T, Hq, D]) or None; when given the output is ``o * sigmoid(gate)``.
    max_seq_len: optional host bound on seq_lens (a launch hint for the kernels; no effect here). Returns [T, Hq, D]."""
    block_size = k_cache.shape[1]
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    for i, context in enumerate(seq_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if end == start:
            continue
        n_blocks = (context + block_size - 1) // block_size
        blocks = block_tables[i, :n_blocks].long()
        keys = k_cache[blocks].flatten(0, 1)[:context].float()  # [ctx, Hkv, D]
        values = v_cache[blocks].flatten(0, 1)[:context].float()
        keys = keys.repeat_interleave(num_heads // num_kv_heads, dim=1)
        values = values.repeat_interleave(num_heads // num_kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), keys) * scale
        q_pos = torch.arange(context - (end - start), context, device=q.device)
        mask = torch.arange(context, device=q.device)[None, :] > q_pos[:, None]
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    if gate is not None:
        out = out * torch.sigmoid(gate.view_as(out))
    return out
