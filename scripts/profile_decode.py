"""Where one decode step's time goes: kernels of graph-replayed decode steps, by name, per step.

usage: python scripts/profile_decode.py --model DIR [--load-format dummy] [--batch 1,32] [--steps 20]
       [--trace-dir DIR]

For each batch size: prefill, settle into decode, time ``--steps`` steps (wall clock, like the engine
runs them), then profile as many steps with ``torch.profiler`` (CUPTI reports each kernel of a replayed
graph). Prints per kernel name: launches per step, microseconds per step, share of the step, and the
microseconds it added to the timeline (its end past the previous kernel's: with PDL a kernel's duration
includes its wait, so that column, not the duration, says where a step's time goes;
``hyserve.bench.kernel_profile``); then the sum of kernel time against the step time (the rest is gaps
between kernels and host waits). With
``--trace-dir`` the Chrome trace of each batch size is written there (the kernel order shows which op
each kernel belongs to).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from hyserve import SamplingParams
from hyserve.bench.kernel_profile import kernel_times, print_kernel_table
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM


def _sync(engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def _run_steps(engine, n: int) -> float:
    _sync(engine)
    t0 = time.perf_counter()
    for _ in range(n):
        engine.step()
    _sync(engine)
    return (time.perf_counter() - t0) / n


def _replay_only(engine, b: int, n: int) -> float:
    """Seconds per replay of batch ``b``'s decode graph with whatever inputs it holds (timing only: it
    rewrites the same KV slots and advances the DeltaNet states of the running sequences)."""
    graphs = engine.runner.graphs
    if graphs is None or graphs.bucket(b) is None:
        return float("nan")
    size = graphs.bucket(b)
    captured = graphs.greedy_graphs.get(size) or graphs.graphs[size]  # the steps' greedy requests take it
    graph = captured.graph
    graph.replay()
    _sync(engine)
    t0 = time.perf_counter()
    for _ in range(n):
        graph.replay()
    _sync(engine)
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--batch", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="kernel names to list per batch size")
    parser.add_argument("--trace-dir", default=None)
    parser.add_argument(
        "--by-predecessor",
        default="_gemv_kernel",
        help="kernel names (comma-separated substrings) to tally per kernel before them ('' for none)",
    )
    ns = parser.parse_args()
    llm = LLM.from_engine_args(engine_args_from(ns))
    engine = llm.engine
    gen = torch.Generator().manual_seed(0)
    high = min(engine.config.vocab_size, 248044)
    summary = []
    for b in [int(x) for x in ns.batch.split(",")]:
        params = SamplingParams(temperature=0.0, max_tokens=3 * ns.steps + 16, ignore_eos=True)
        for i in range(b):
            engine.add_request(
                f"prof-{b}-{i}", torch.randint(0, high, (ns.prompt_len,), generator=gen).tolist(), params
            )
        while engine.scheduler.waiting:  # prefill every prompt
            engine.step()
        _run_steps(engine, 4)
        step_ms = _run_steps(engine, ns.steps) * 1e3
        replay_ms = _replay_only(engine, b, ns.steps) * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _run_steps(engine, ns.steps)
        while engine.has_unfinished_requests():
            engine.step()
        rows = kernel_times(prof, ns.steps, tuple(p for p in ns.by_predecessor.split(",") if p))
        kernel_us = sum(r[2] for r in rows)
        busy_us = sum(r[3] for r in rows)
        print(
            f"\n== batch {b}: step {step_ms:.3f} ms wall, kernels {kernel_us / 1e3:.3f} ms per step "
            f"(busy {busy_us / 1e3:.3f} ms: the 'added us' column)"
        )
        print_kernel_table(rows, step_ms, ns.top)
        launches = sum(r[1] for r in rows)
        summary.append((b, step_ms, replay_ms, kernel_us / 1e3, launches))
        if ns.trace_dir:
            os.makedirs(ns.trace_dir, exist_ok=True)
            prof.export_chrome_trace(os.path.join(ns.trace_dir, f"decode_b{b}.json"))
    print(
        "\nstep: engine.step() wall; replay: the captured graph alone, back to back (no host work); kernels:"
    )
    print(
        "the profiler's kernel sum. step - replay is host time the GPU waits for; replay - kernels is gaps."
    )
    print(f"{'batch':>5} {'step ms':>8} {'replay ms':>9} {'kernel ms':>9} {'launches':>8} {'tok/s':>8}")
    for b, step, replay, kern, launches in summary:
        print(f"{b:>5} {step:8.3f} {replay:9.3f} {kern:9.3f} {launches:8.0f} {b / step * 1e3:8.1f}")


if __name__ == "__main__":
    main()
