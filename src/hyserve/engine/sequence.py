"""One generation stream: its tokens, its place in the cache, and how far it has been computed."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from hyserve.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"  # EOS, a stop token or a stop string
    FINISHED_LENGTH = "length"  # max_tokens or the model length
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (
            SequenceStatus.FINISHED_STOPPED,
            SequenceStatus.FINISHED_LENGTH,
            SequenceStatus.FINISHED_ABORTED,
        )


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    index: int = 0  # which of the request's n choices
    arrival_time: float = 0.0
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV / DeltaNet state is in the cache
    block_table: list[int] = field(default_factory=list)
    state_slot: int | None = None
    num_preemptions: int = 0
    # per generated token: (chosen token logprob, [(token, logprob)] top alternatives)
    output_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    # per prompt token from position 1 on (position 0 has none)
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    stop_reason: int | str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def kv_slot(self, pos: int, block_size: int) -> int:
        """The flat KV-cache slot of this sequence's token at position ``pos``."""
        return self.block_table[pos // block_size] * block_size + pos % block_size

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and not self.prompt_logprobs_done

    @property
    def prompt_logprobs_done(self) -> bool:
        return len(self.prompt_logprobs) >= max(0, self.num_prompt_tokens - 1)
