"""Whole-prefill CUDA graphs on the GPU: same first-token logprobs as the eager prefill, and how much sooner.

usage: python scripts/check_prefill_graphs.py --model DIR --load-format dummy --prefill-graph-sizes 128,256,512,1024,2048,4096
       [--prompt-lens 100,128,1000,1024,4096] [--reps 5]

For each prompt length: one prompt prefilled alone, first token with its top-20 logprobs, through the graph
(``runner.prefill_graphs``) and through the eager prefill (the same engine with the graphs set aside). The two
run the same kernels but for the prompt's causal attention: cuDNN in the graphs, flash eagerly
(``kernels/attention/causal.py``), so they round differently, and the dummy model amplifies that through 40
layers (0.2-0.5 nats on the H200, 2026-12-05; docs/performance.md). A padded prompt runs every op at the
bucket's token count, so it is compared with the eager prefill of the same prompt batched with a companion
prompt of the padding's length (the same shapes); its difference from the prompt prefilled alone is printed too
(``alone``). ``noise``: the larger difference between two runs of one path (graph, eager) on the same prompt
(0 on the H200: both are deterministic). A plain greedy request (no logprobs) through the graph takes the LM
head's greedy screen instead of the logits: its token must be the graph's top-1 (``greedy``). Then the time to
first token of both paths, with logprobs (median of ``--reps``). Exits non-zero when the greedy screen's token
differs or a difference beyond ``--max-nats`` (1.0: twice the largest seen between the two attention backends)
shows up against the same-shape eager prefill; a top-1 that differs is reported, not failed (the dummy
model's top logits are near ties).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hyserve import SamplingParams
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM


def _first_output(
    engine, prompt: list[int], tag: str, params: SamplingParams, companion: list[int] | None = None
):
    """(seconds to the prompt's first token, its CompletionOutput); a companion prompt prefills beside it."""
    t0 = time.perf_counter()
    engine.add_request(tag, prompt, params)
    if companion:
        engine.add_request(tag + "-companion", companion, params)
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    return time.perf_counter() - t0, [o for o in outs if o.request_id == tag][-1].outputs[0]


def _first_token(
    engine, prompt: list[int], tag: str, companion: list[int] | None = None
) -> tuple[float, tuple[float, list[tuple[int, float]]]]:
    """Seconds to the prompt's first token and its (logprob, top-20)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=20)
    seconds, out = _first_output(engine, prompt, tag, params, companion)
    return seconds, out.logprobs[0]


def _greedy_token(engine, prompt: list[int], tag: str) -> int:
    """The first token of a plain greedy request (no logprobs: the runner may take the greedy screen)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    return _first_output(engine, prompt, tag, params)[1].token_ids[0]


def _worst(a: tuple[float, list[tuple[int, float]]], b: tuple[float, list[tuple[int, float]]]) -> float:
    """Largest |logprob difference| over the chosen token and a's top-20 tokens that b also lists."""
    (lp_a, top_a), (lp_b, top_b) = a, b
    other = dict(top_b)
    diffs = [abs(lp_a - lp_b)] + [abs(lp - other[t]) for t, lp in top_a if t in other]
    return max(diffs) if diffs else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--prompt-lens", default="100,128,1000,1024,4096")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--max-nats", type=float, default=1.0, help="the largest |logprob difference| allowed"
    )
    ns = parser.parse_args()
    engine = LLM.from_engine_args(engine_args_from(ns)).engine
    graphs = engine.runner.prefill_graphs
    if graphs is None:
        raise SystemExit("no prefill graphs were captured (see --prefill-graph-sizes and the log)")
    gen = torch.Generator().manual_seed(0)
    high = min(engine.config.vocab_size, 248044)
    ok = True
    print(
        f"{'prompt':>6} {'bucket':>12} {'same top-1':>10} {'max |dlogp|':>11} {'alone':>7} {'noise':>7} "
        f"{'greedy':>6} {'graph ms':>9} {'eager ms':>9}"
    )
    for n in [int(x) for x in ns.prompt_lens.split(",")]:
        prompt = torch.randint(0, high, (n,), generator=gen).tolist()
        times: dict[str, list[float]] = {"graph": [], "eager": []}
        first, again = {}, {}
        for path in ("graph", "eager", "graph", "eager"):  # alternate: no order effect on the timing
            engine.runner.prefill_graphs = graphs if path == "graph" else None
            if path in first:
                again[path] = first[path]
            _, first[path] = _first_token(engine, prompt, f"{path}-{n}")
            for i in range(ns.reps // 2 + 1):
                times[path].append(_first_token(engine, prompt, f"{path}-{n}-{i}")[0])
        size, exact = graphs.bucket(n) or (None, False)
        same_shape = first["eager"]
        if size and not exact:  # the eager prefill at the graph's token count: the prompt + a companion
            engine.runner.prefill_graphs = None
            companion = torch.randint(0, high, (size - n,), generator=gen).tolist()
            _, same_shape = _first_token(engine, prompt, f"batched-{n}", companion)
        engine.runner.prefill_graphs = graphs
        same = first["graph"][1][0][0] == same_shape[1][0][0]
        worst = _worst(first["graph"], same_shape)
        greedy = _greedy_token(engine, prompt, f"greedy-{n}") == first["graph"][1][0][0]
        noise = max(_worst(first[p], again[p]) for p in ("graph", "eager"))
        ok &= greedy and worst < ns.max_nats
        where = f"{size} {'exact' if exact else 'padded'}" if size else "none (eager)"
        g_ms, e_ms = (statistics.median(times[p]) * 1e3 for p in ("graph", "eager"))
        alone = _worst(first["graph"], first["eager"])
        print(
            f"{n:>6} {where:>12} {str(same):>10} {worst:11.4f} {alone:7.4f} {noise:7.4f} {str(greedy):>6} {g_ms:9.2f} "
            f"{e_ms:9.2f}"
        )
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
