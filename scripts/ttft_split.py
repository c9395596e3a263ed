"""Where a served first token's time goes: the client's TTFT against the server's own clocks, per prompt length.

For each length, ``--reps`` sequential streamed completions (random token ids, ``max_tokens`` 1, the
``hyserve bench`` client) after one unmeasured request, with ``/metrics`` read before and after the measured
ones. From the deltas of the server's histograms:

- ``server``: ``hyserve:time_to_first_token_seconds``, from the handler's arrival mark (the body parsed and
  validated) to the engine thread having the sampled token;
- ``step``: ``hyserve:iteration_seconds{kind="mixed"}``, the engine steps that ran the prompts (the whole
  ``engine.step()`` call: scheduling, input staging, the prefill graph, the token read back).

So ``client - server`` is the HTTP path (the client building and sending the request, uvicorn, the parse; the
token's way from the engine thread to the event loop, the SSE chunk, the client reading it) and ``server - step``
is the wait between the handler and the engine's step (queue, engine thread wake-up, scheduling). Means in ms.

usage: python scripts/ttft_split.py --url http://127.0.0.1:8011 [--prompt-lens 128,1024,4096] [--reps 10]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics

import aiohttp

from hyserve.bench.client import completion_payload, random_prompt, stream_completion

_SAMPLE = re.compile(r"^(hyserve:[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {"name{labels}": value} for hyserve's own samples."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def delta_mean_ms(
    before: dict[str, float], after: dict[str, float], name: str, kind: str | None = None
) -> float:
    """Mean of the histogram ``name``'s observations between two reads, ms (those with ``kind="..."`` if given)."""

    def pick(sample: dict[str, float], key: str) -> float:
        for k, value in sample.items():
            if k.split("{")[0] == key and (kind is None or f'kind="{kind}"' in k):
                return value
        return 0.0

    count = pick(after, name + "_count") - pick(before, name + "_count")
    total = pick(after, name + "_sum") - pick(before, name + "_sum")
    return total / count * 1e3 if count else float("nan")


async def measure(url: str, lens: list[int], reps: int, vocab: int, seed: int) -> None:
    rng = random.Random(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async with session.get(f"{url}/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]

        async def metrics() -> dict[str, float]:
            async with session.get(f"{url}/metrics") as resp:
                return parse_metrics(await resp.text())

        head = ("prompt", "client", "median", "server", "step", "client-server", "server-step")
        print(" ".join(f"{h:>{max(8, len(h))}}" for h in head))
        for n in lens:
            payloads = [completion_payload(model, random_prompt(rng, n, vocab), 1) for _ in range(reps + 1)]
            await stream_completion(session, url, payloads[0], {})  # unmeasured
            before = await metrics()
            ttfts = []
            for payload in payloads[1:]:
                res = await stream_completion(session, url, payload, {})
                if not res.ok or res.ttft_s is None:
                    raise SystemExit(f"request failed at prompt {n}: {res.error}")
                ttfts.append(res.ttft_s * 1e3)
            after = await metrics()
            server = delta_mean_ms(before, after, "hyserve:time_to_first_token_seconds")
            step = delta_mean_ms(before, after, "hyserve:iteration_seconds", "mixed")
            client = statistics.mean(ttfts)
            row = (client, statistics.median(ttfts), server, step, client - server, server - step)
            print(f"{n:>8} " + " ".join(f"{v:>{max(8, len(h))}.2f}" for v, h in zip(row, head[1:])))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--prompt-lens", default="128,1024,4096", help="comma-separated prompt lengths")
    p.add_argument("--reps", type=int, default=10, help="measured requests a length (default 10)")
    p.add_argument("--vocab-size", type=int, default=248044, help="prompt ids are drawn below this")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    lens = [int(x) for x in args.prompt_lens.split(",")]
    asyncio.run(measure(args.url.rstrip("/"), lens, args.reps, args.vocab_size, args.seed))


if __name__ == "__main__":
    main()
