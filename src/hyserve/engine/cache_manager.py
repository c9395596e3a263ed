"""Book-keeping of cache memory: paged KV blocks (attention layers) and DeltaNet state slots.

CPU-only: it hands out block ids and slot ids; the runner owns the tensors they index.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyserve.engine.sequence import Sequence


@dataclass(frozen=True)
class CacheConfig:
    block_size: int  # tokens per KV block
    num_blocks: int  # KV blocks per attention layer
    num_state_slots: int  # DeltaNet (conv + recurrent) state slots, one per running sequence

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.num_blocks <= 0 or self.num_state_slots <= 0:
            raise ValueError(f"cache sizes must be positive, got {self}")


class CacheManager:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self._free_blocks = list(range(config.num_blocks - 1, -1, -1))  # pop() takes the lowest id
        self._free_slots = list(range(config.num_state_slots - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def usage(self) -> float:
        """Fraction of KV blocks in use, 0..1."""
        return 1.0 - self.num_free_blocks / self.config.num_blocks

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``num_tokens`` tokens in all."""
        need = -(-num_tokens // self.block_size)
        return max(0, need - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        slot_ok = seq.state_slot is not None or self._free_slots
        return bool(slot_ok) and self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq``'s block table to hold ``num_tokens`` tokens; give it a state slot if it has none."""
        if not self.can_allocate(seq, num_tokens):
            raise RuntimeError(f"cache exhausted for sequence {seq.seq_id}; call can_allocate first")
        if seq.state_slot is None:
            seq.state_slot = self._free_slots.pop()
        for _ in range(self.blocks_needed(seq, num_tokens)):
            seq.block_table.append(self._free_blocks.pop())

    def free(self, seq: Sequence) -> None:
        """Return every block and the slot of ``seq``; it will be recomputed from scratch if resumed."""
        self._free_blocks.extend(reversed(seq.block_table))
        seq.block_table = []
        if seq.state_slot is not None:
            self._free_slots.append(seq.state_slot)
            seq.state_slot = None
        seq.num_computed_tokens = 0
