"""Where a prefill's time goes (time to first token without HTTP): one request of each prompt length
on an idle engine, ``max_tokens=1``, timed from ``add_request`` to its output (median of ``--reps``),
then one more run under ``torch.profiler``: kernel time by name.

usage: python scripts/profile_prefill.py --model DIR [--load-format dummy] [--prompt-lens 128,1024,4096] [--gap-ms 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from hyserve import SamplingParams
from hyserve.bench.kernel_profile import kernel_times, print_kernel_table
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM


def _prefill(engine, prompt: list[int], tag: str) -> float:
    """Seconds from adding the request to its first (and only) token on the host."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    t0 = time.perf_counter()
    engine.add_request(tag, prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - t0


def _idle_then_prefill(engine, prompt: list[int], tag: str, gap_ms: float) -> float:
    """``_prefill`` after ``gap_ms`` of an idle GPU (synchronised first, so the gap is idle time)."""
    if gap_ms > 0:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        time.sleep(gap_ms / 1e3)
    return _prefill(engine, prompt, tag)


def _host_profile(engine, prompt: list[int], n: int, top: int) -> None:
    """cProfile of one prefill: where the host's time goes (launch overhead of the eager step)."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    _prefill(engine, prompt, f"cprof-{n}")
    pr.disable()
    stats = pstats.Stats(pr)
    print(f"-- host time of one {n}-token prefill by function (tottime, then cumulative):")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--prompt-lens", default="128,1024,4096")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--top", type=int, default=18, help="kernel names to list per prompt length")
    parser.add_argument("--cprofile", action="store_true", help="also the host's Python time by function")
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="idle time before each timed prefill (the bench's gaps: GPU clocks)",
    )
    ns = parser.parse_args()
    engine = LLM.from_engine_args(engine_args_from(ns)).engine
    gen = torch.Generator().manual_seed(0)
    high = min(engine.config.vocab_size, 248044)
    summary = []
    for n in [int(x) for x in ns.prompt_lens.split(",")]:
        prompts = [torch.randint(0, high, (n,), generator=gen).tolist() for _ in range(ns.reps + 2)]
        _prefill(engine, prompts[0], f"warm-{n}")
        ms = 1e3 * statistics.median(
            _idle_then_prefill(engine, p, f"p{n}-{i}", ns.gap_ms) for i, p in enumerate(prompts[1:-1])
        )
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _prefill(engine, prompts[-1], f"prof-{n}")
        rows = kernel_times(prof, 1)
        kernel_ms = sum(r[2] for r in rows) / 1e3
        print(
            f"\n== prompt {n}: {ms:.2f} ms to the first token (median of {ns.reps}), kernels {kernel_ms:.2f} ms"
        )
        print_kernel_table(rows, ms, ns.top)
        summary.append((n, ms, kernel_ms))
        if ns.cprofile:
            _host_profile(engine, prompts[1], n, ns.top)
    print(f"\n{'prompt':>6} {'TTFT ms':>8} {'kernel ms':>9}")
    for n, ms, kernel_ms in summary:
        print(f"{n:>6} {ms:8.2f} {kernel_ms:9.2f}")


if __name__ == "__main__":
    main()
