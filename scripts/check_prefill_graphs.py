"""Whole-prefill CUDA graphs on the GPU: same first-token logprobs as the eager prefill, and how much sooner.

usage: python scripts/check_prefill_graphs.py --model DIR --load-format dummy --prefill-graph-sizes 128,256,512,1024,2048,4096
       [--prompt-lens 100,128,1000,1024,4096] [--reps 5]

For each prompt length: one prompt prefilled alone, first token with its top-20 logprobs, through the graph
(``runner.prefill_graphs``) and through the eager prefill (the same engine with the graphs set aside). A
prompt whose length is a captured size replays exactly the eager kernels (difference 0 expected); a padded
one runs the MoE at the bucket's token count, whose tile plan may differ (bf16 rounding, ~1e-2). Then the
time to first token of both (median of ``--reps``). Exits non-zero when a chosen token or a difference
beyond 0.1 nats shows up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hyserve import SamplingParams
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM


def _first_token(engine, prompt: list[int], tag: str) -> tuple[float, tuple[float, list[tuple[int, float]]]]:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=20)
    t0 = time.perf_counter()
    engine.add_request(tag, prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    return time.perf_counter() - t0, outs[-1].outputs[0].logprobs[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--prompt-lens", default="100,128,1000,1024,4096")
    parser.add_argument("--reps", type=int, default=5)
    ns = parser.parse_args()
    engine = LLM.from_engine_args(engine_args_from(ns)).engine
    graphs = engine.runner.prefill_graphs
    if graphs is None:
        raise SystemExit("no prefill graphs were captured (see --prefill-graph-sizes and the log)")
    gen = torch.Generator().manual_seed(0)
    high = min(engine.config.vocab_size, 248044)
    ok = True
    print(
        f"{'prompt':>6} {'bucket':>12} {'same top-1':>10} {'max |dlogp|':>11} {'graph ms':>9} {'eager ms':>9}"
    )
    for n in [int(x) for x in ns.prompt_lens.split(",")]:
        prompt = torch.randint(0, high, (n,), generator=gen).tolist()
        times: dict[str, list[float]] = {"graph": [], "eager": []}
        first = {}
        for path in ("graph", "eager", "graph", "eager"):  # alternate: no order effect on the timing
            engine.runner.prefill_graphs = graphs if path == "graph" else None
            _, first[path] = _first_token(engine, prompt, f"{path}-{n}")
            for i in range(ns.reps // 2 + 1):
                times[path].append(_first_token(engine, prompt, f"{path}-{n}-{i}")[0])
        engine.runner.prefill_graphs = graphs
        (lp_g, top_g), (lp_e, top_e) = first["graph"], first["eager"]
        eager = dict(top_e)
        diffs = [abs(lp_g - lp_e)] + [abs(lp - eager[t]) for t, lp in top_g if t in eager]
        same = top_g[0][0] == top_e[0][0]
        worst = max(diffs) if diffs else float("inf")
        ok &= same and worst < 0.1
        size, exact = graphs.bucket(n) or (None, False)
        where = f"{size} {'exact' if exact else 'padded'}" if size else "none (eager)"
        g_ms, e_ms = (statistics.median(times[p]) * 1e3 for p in ("graph", "eager"))
        print(f"{n:>6} {where:>12} {str(same):>10} {worst:11.4f} {g_ms:9.2f} {e_ms:9.2f}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
