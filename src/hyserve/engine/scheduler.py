"""Continuous batching with chunked prefill (CPU-only logic).

Every step has a token budget. Running sequences go first (decodes and unfinished prefill chunks, in
arrival order), then waiting ones, first come first served, as far as the budget, ``max_num_seqs``
and the cache allow. When the cache cannot hold a running sequence's next tokens, the newest running
sequence is preempted: its blocks and state slot are freed, and it is recomputed later from its prompt
plus what it has generated so far (the DeltaNet state cannot be rebuilt from a partial cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hyserve.engine.cache_manager import CacheManager
from hyserve.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences in one step
    max_num_batched_tokens: int = 8192  # new tokens in one step (the prefill chunk budget)
    max_model_len: int = 4096  # prompt + output tokens of one sequence

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step, starting at seq.num_computed_tokens
    sample: bool  # this chunk reaches the end of the sequence: sample its next token
    # seq.num_computed_tokens when scheduled (the sequence's count moves on after the step, and back to 0
    # when it finishes and frees its cache)
    start: int = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.seq.num_computed_tokens


@dataclass
class SchedulerOutput:
    """What the runner computes in one step."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # freed this step, back in the waiting queue

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_decode(self) -> bool:
        """Every sequence computes exactly one token after cached ones: the recurrent kernels and CUDA-graph
        case (a one-token prompt has no state to continue from, so it goes the prefill way)."""
        return bool(self.scheduled) and all(s.num_new_tokens == 1 and s.start > 0 for s in self.scheduled)

    @property
    def empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, cache: CacheManager) -> None:
        self.config = config
        self.cache = cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        if seq.num_tokens >= self.config.max_model_len:
            raise ValueError(
                f"prompt has {seq.num_tokens} tokens; the model length is {self.config.max_model_len}"
            )
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Stop ``seq`` wherever it is and return its cache."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.cache.free(seq)
        seq.status = SequenceStatus.FINISHED_ABORTED

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        self.running.remove(seq)
        self.cache.free(seq)
        seq.status = status

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.cache.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        scheduled_ids: set[int] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_uncomputed, budget)
            while not self.cache.can_allocate(seq, seq.num_computed_tokens + num_new):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                self.cache.allocate(seq, seq.num_computed_tokens + num_new)
                out.scheduled.append(self._entry(seq, num_new))
                scheduled_ids.add(seq.seq_id)
                budget -= num_new
                i += 1
                continue
            # seq itself was preempted; the list shifted, do not advance
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            num_new = min(seq.num_uncomputed, budget)
            if not self.cache.can_allocate(seq, seq.num_computed_tokens + num_new):
                break
            self.waiting.popleft()
            self.cache.allocate(seq, seq.num_computed_tokens + num_new)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(self._entry(seq, num_new))
            budget -= num_new
        return out

    @staticmethod
    def _entry(seq: Sequence, num_new: int) -> ScheduledSequence:
        return ScheduledSequence(seq, num_new, sample=seq.num_computed_tokens + num_new == seq.num_tokens)

    def update_computed(self, out: SchedulerOutput) -> None:
        """After the runner has run ``out``: the scheduled tokens are now in the cache."""
        for entry in out.scheduled:
            entry.seq.num_computed_tokens += entry.num_new_tokens
