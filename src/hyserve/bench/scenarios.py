"""The scenarios (decode, ttft, throughput) as lists of levels, and the closed-loop runner of one level."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass

import aiohttp
from tqdm import tqdm

from hyserve.bench.client import RequestResult, completion_payload, random_prompt, stream_completion

SCENARIOS = ("decode", "ttft", "throughput")


@dataclass(frozen=True)
class LevelSpec:
    """One row of the report: ``num_requests`` requests of ``prompt_len`` + ``output_len`` tokens, kept
    ``concurrency`` in flight."""

    scenario: str
    concurrency: int
    num_requests: int
    prompt_len: int
    output_len: int

    @property
    def label(self) -> str:
        if self.scenario == "ttft":
            return f"ttft p={self.prompt_len}"
        return f"{self.scenario} c={self.concurrency}"


@dataclass
class LevelRun:
    """A finished level: its spec, the per-request results in submission order, and the wall time (s)
    from the first request sent to the last one finished."""

    spec: LevelSpec
    results: list[RequestResult]
    duration_s: float


@dataclass(frozen=True)
class Target:
    """Where and how to send requests."""

    url: str
    model: str
    headers: dict[str, str]
    vocab_size: int


def plan_levels(
    scenarios: list[str],
    *,
    prompt_len: int | None,
    output_len: int | None,
    prompt_lens: list[int],
    ttft_reps: int,
    ttft_output_len: int,
    concurrency: list[int],
    num_prompts: int | None,
) -> list[LevelSpec]:
    """The levels of the given scenarios, in order. ``prompt_len``/``output_len`` None pick the scenario
    defaults (decode 128/512, throughput 1024/512); ``num_prompts`` None means ``max(8, 4 * concurrency)``."""
    levels: list[LevelSpec] = []
    for name in scenarios:
        if name == "decode":
            levels.append(LevelSpec("decode", 1, 1, prompt_len or 128, output_len or 512))
        elif name == "ttft":
            levels += [LevelSpec("ttft", 1, ttft_reps, p, ttft_output_len) for p in prompt_lens]
        elif name == "throughput":
            for c in concurrency:
                n = num_prompts or max(8, 4 * c)
                levels.append(LevelSpec("throughput", c, n, prompt_len or 1024, output_len or 512))
        else:
            raise ValueError(f"unknown scenario {name!r}")
    return levels


async def run_level(
    session: aiohttp.ClientSession, target: Target, spec: LevelSpec, rng: random.Random, progress: bool = True
) -> LevelRun:
    """Send ``spec.num_requests`` fresh random prompts with exactly ``spec.concurrency`` in flight (each
    worker sends its next request when its previous one ends), with a tqdm bar on stderr."""
    payloads = [
        completion_payload(
            target.model, random_prompt(rng, spec.prompt_len, target.vocab_size), spec.output_len
        )
        for _ in range(spec.num_requests)
    ]
    results: list[RequestResult | None] = [None] * len(payloads)
    order = iter(range(len(payloads)))
    bar = tqdm(
        total=len(payloads), desc=spec.label, unit="req", file=sys.stderr, disable=not progress, leave=True
    )
    failed = tokens = 0
    t0 = time.perf_counter()

    async def worker() -> None:
        nonlocal failed, tokens
        for i in order:
            res = await stream_completion(session, target.url, payloads[i], target.headers)
            results[i] = res
            failed += not res.ok
            tokens += res.completion_tokens if res.ok else 0
            bar.set_postfix(fail=failed, tok_s=f"{tokens / (time.perf_counter() - t0):.1f}", refresh=False)
            bar.update(1)

    await asyncio.gather(*(worker() for _ in range(min(spec.concurrency, len(payloads)))))
    duration = time.perf_counter() - t0
    bar.close()
    return LevelRun(spec, [r for r in results if r is not None], duration)
