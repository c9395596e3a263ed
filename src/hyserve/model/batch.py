"""The contract between the runner and the model: what one forward pass computes, and the caches it uses."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    """N sequences whose new tokens (T in all) are packed along one axis.

    A sequence contributes its whole prompt, a chunk of it (chunked prefill) or one token (decode).
    """

    input_ids: torch.Tensor  # [T] int64 token ids
    positions: torch.Tensor  # [T] int64 absolute position of each token in its sequence
    cu_seqlens_q: torch.Tensor  # [N+1] int32 offsets of each sequence's new tokens
    seq_lens: torch.Tensor  # [N] int32 context length after this step (cached + new tokens)
    block_tables: torch.Tensor  # [N, max_blocks] int32 KV-cache block ids of each sequence (-1 padded)
    slot_mapping: torch.Tensor  # [T] int64 flat KV-cache slot for each new token (-1: do not store)
    state_indices: torch.Tensor  # [N] int64 DeltaNet state slot of each sequence
    has_initial_state: torch.Tensor  # [N] bool the sequence has cached tokens before this step
    logits_indices: torch.Tensor  # [L] int64 rows that need logits, increasing: the rows the model returns
    is_decode: bool  # every sequence has exactly one new token (recurrent kernels, CUDA graphs)
    # the new tokens may attend as one causal run over all T rows, without the cache: one prompt with no cached
    # prefix (or the prefill graph's prompt with its throw-away padding sequence after it, whose rows nothing reads)
    causal_rows: bool = False

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    def rows_as_queries(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows [L] as L one-token queries over their sequences' KV caches, for ``paged_attention``:
        (cu_seqlens_q [L+1] int32, seq_lens [L] int32: each row's position + 1, its causal context, block_tables
        [L, max_blocks] int32: its sequence's). No host reads (CUDA-graph safe)."""
        seq = torch.searchsorted(self.cu_seqlens_q[1:], rows.to(self.cu_seqlens_q.dtype), right=True)
        cu = torch.arange(rows.shape[0] + 1, dtype=torch.int32, device=rows.device)
        return cu, (self.positions[rows] + 1).to(torch.int32), self.block_tables[seq]


@dataclass
class ModelCache:
    """Per-layer cache tensors, allocated once by the runner and indexed by the batch's slots."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per full-attention layer: k, v [num_blocks, block, Hkv, D]
    conv_state: torch.Tensor  # [num_linear_layers, num_slots, W-1, conv_dim] model dtype
    ssm_state: torch.Tensor  # [num_linear_layers, num_slots, HV, K, V] fp32

    @property
    def block_size(self) -> int:
        return self.kv[0][0].shape[1] if self.kv else 0
