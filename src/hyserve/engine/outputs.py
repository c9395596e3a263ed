"""What the engine reports to its callers (the offline API and the server)."""

from __future__ import annotations

from dataclasses import dataclass

# per token: (logprob of the token, [(alternative token id, logprob)] best first)
TokenLogprob = tuple[float, list[tuple[int, float]]]


@dataclass
class CompletionOutput:
    index: int  # which of the request's n choices
    text: str  # generated text so far (a tail that may become a stop string is held back until the end)
    token_ids: list[int]  # generated token ids so far
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestMetrics:
    arrival_time: float  # time.monotonic() seconds
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    prompt: str | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token; None for the first
    num_preemptions: int = 0
