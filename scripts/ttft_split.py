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
import statistics

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from hyserve.bench.client import completion_payload, random_prompt, stream_completion

Sample = dict[tuple[str, str | None], float]  # (sample name, its "kind" label or None) -> value


def parse_metrics(text: str) -> Sample:
    """Prometheus text -> hyserve's own samples (prometheus_client's parser), keyed by name and ``kind`` label."""
    return {
        (s.name, s.labels.get("kind")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("hyserve:")
    }


def delta_mean_ms(before: Sample, after: Sample, name: str, kind: str | None = None) -> float:
    """Mean of the histogram ``name``'s observations between two reads, ms (those with ``kind="..."`` if given)."""
    count = after.get((name + "_count", kind), 0.0) - before.get((name + "_count", kind), 0.0)
    total = after.get((name + "_sum", kind), 0.0) - before.get((name + "_sum", kind), 0.0)
    return total / count * 1e3 if count else float("nan")


async def measure(url: str, lens: list[int], reps: int, vocab: int, seed: int) -> None:
    rng = random.Random(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async with session.get(f"{url}/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]

        async def metrics() -> Sample:
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
