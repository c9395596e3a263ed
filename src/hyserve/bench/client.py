"""Streaming ``/v1/completions`` client: one request, timed (only standard OpenAI fields plus ``ignore_eos``)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

# ids below this are bytes/special-ish pieces in most BPE vocabularies; random prompts avoid them
MIN_TOKEN_ID = 1000


@dataclass
class RequestResult:
    """Timings of one streamed request. Times are seconds from just before the request was sent."""

    prompt_len: int
    max_tokens: int
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    usage_reported: bool = False
    chunk_times_s: list[float] = field(default_factory=list)

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first, seconds: ``(e2e - ttft) / (tokens - 1)``."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """The per-request record of ``results.json`` (times in ms)."""

        def ms(x: float | None) -> float | None:
            return None if x is None else round(x * 1e3, 4)

        gaps = [b - a for a, b in zip(self.chunk_times_s, self.chunk_times_s[1:])]
        return {
            "ok": self.ok,
            "error": self.error,
            "prompt_len": self.prompt_len,
            "max_tokens": self.max_tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "usage_reported": self.usage_reported,
            "ttft_ms": ms(self.ttft_s),
            "tpot_ms": ms(self.tpot_s),
            "e2e_ms": ms(self.e2e_s),
            "chunks": len(self.chunk_times_s),
            "max_chunk_gap_ms": ms(max(gaps)) if gaps else None,
        }


def random_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    """``length`` token ids drawn uniformly from ``[MIN_TOKEN_ID, vocab_size)`` (the upper half of a vocabulary
    smaller than ``2 * MIN_TOKEN_ID``, so tiny test models can be benchmarked too)."""
    return rng.choices(range(min(MIN_TOKEN_ID, vocab_size // 2), vocab_size), k=length)


def completion_payload(model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """The request body: greedy, ``ignore_eos`` so every request produces exactly ``max_tokens``."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def stream_completion(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], headers: dict[str, str]
) -> RequestResult:
    """POST ``payload`` to ``{url}/v1/completions`` and time the SSE stream; never raises on server errors.

    Every chunk with choices is a token chunk, as ``vllm bench serve`` counts them (servers send one per
    step that produced tokens, with text or without: a model without tokenizer files has none); TTFT is the
    arrival of the first one. The token count is ``usage.completion_tokens`` from the final
    chunk, or the number of token chunks when the server sends no usage (``usage_reported`` is then False).
    """
    res = RequestResult(prompt_len=len(payload["prompt"]), max_tokens=payload["max_tokens"])
    t0 = time.perf_counter()
    try:
        async with session.post(f"{url}/v1/completions", json=payload, headers=headers) as resp:
            if resp.status != 200:
                body = (await resp.text())[:200].strip()
                res.error = f"HTTP {resp.status}: {body}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    res.error = f"stream error: {json.dumps(chunk['error'])[:200]}"
                    return res
                choices = chunk.get("choices") or []
                if choices:
                    now = time.perf_counter() - t0
                    if res.ttft_s is None:
                        res.ttft_s = now
                    res.chunk_times_s.append(now)
                usage = chunk.get("usage")
                if usage:
                    res.usage_reported = True
                    res.completion_tokens = int(usage.get("completion_tokens") or 0)
                    res.prompt_tokens = usage.get("prompt_tokens")
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"[:200]
        return res
    res.e2e_s = time.perf_counter() - t0
    if not res.usage_reported:
        res.completion_tokens = len(res.chunk_times_s)
    if res.ttft_s is None or res.completion_tokens == 0:
        res.error = "no tokens in the stream"
        return res
    res.ok = True
    return res
