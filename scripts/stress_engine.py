"""Stress the engine offline the way a serving benchmark ends: many requests with different prompt and
output lengths, so steps mix prefill chunks with decodes and the decode batch shrinks through every
CUDA-graph bucket. Exits non-zero on any error; prints the batch sizes seen and where the time went:
wall seconds of decode steps (by batch size) and of mixed steps (with prefill tokens). With async
scheduling the host returns from a step once the step before it is read, so a step's wall time is the
device time of the step before it while the GPU is the bottleneck.

The c=32 throughput benchmark's workload offline (no HTTP):
python scripts/stress_engine.py --model DIR --load-format dummy --max-num-seqs 32 --requests 128 \
    --prompt-len 1024,1024 --output-len 512,512

usage: python scripts/stress_engine.py --model DIR --load-format dummy [--requests 64] [--enforce-eager]
(run with CUDA_LAUNCH_BLOCKING=1 and --enforce-eager to name the kernel of an asynchronous CUDA error)
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter, deque

import torch

from hyserve import SamplingParams
from hyserve.bench.kernel_profile import kernel_times, print_kernel_table
from hyserve.engine.args import add_engine_arguments, engine_args_from
from hyserve.llm import LLM

_compiles: list[tuple[float, str]] = []  # (perf_counter seconds, kernel specialization) of each new variant


def _log_compiles() -> None:
    """Record every Triton kernel specialization the process builds (or loads) for the first time; for a
    kernel seen before, only the arguments whose specialization differs from its previous variant."""
    from triton import knobs

    seen: dict[str, list[str]] = {}

    def hook(*, repr: str, fn, **_: object) -> None:
        args = " ".join(repr.split()).split("](", 1)[-1].split(", ")
        previous = seen.get(fn.name)
        if previous is None:
            text = f"{fn.name}: first variant"
        else:
            changed = [f"{a} (was {b})" for a, b in zip(args, previous) if a != b]
            text = f"{fn.name}: " + "; ".join(changed or ["same arguments, other options"]).rstrip(")")
        seen[fn.name] = args
        _compiles.append((time.perf_counter(), text))

    knobs.runtime.jit_cache_hook = hook


PROFILE_STEPS = 20


def _toggle_profile(engine, prof):
    """Start a kernel profile (prof None) or stop the running one; returns the profile object."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    if prof is None:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        prof = torch.profiler.profile(activities=acts[: 1 + (engine.device.type == "cuda")])
        prof.__enter__()
    else:
        prof.__exit__(None, None, None)
    return prof


def _print_failure(engine, history: deque[str]) -> None:
    """What ran before a failed step: CUDA errors surface at the next sync, a step or two late."""
    print(
        "failed step:",
        _describe(engine.last_step),
        "| launched ahead of it:",
        _describe(engine._pending and engine._pending.out),
    )
    print("steps before it (oldest first):", "; ".join(history))


def _describe(out) -> str:
    if out is None:
        return "none"
    return (
        f"{'decode' if out.is_decode else 'mixed'} of {len(out.scheduled)} sequences, {out.num_tokens} tokens"
    )


def _run_pass(engine, ns, rng: random.Random, tag: str) -> bool:
    lo_p, hi_p = (int(v) for v in ns.prompt_len.split(","))
    lo_o, hi_o = (int(v) for v in ns.output_len.split(","))
    high = min(engine.config.vocab_size, 248044)
    requests = []
    for i in range(ns.requests):
        prompt = [rng.randrange(high) for _ in range(rng.randint(lo_p, hi_p))]
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(lo_o, hi_o), ignore_eos=True)
        requests.append((f"stress-{tag}-{i}", prompt, params))
    requests.reverse()
    # closed loop (like a benchmark client with --concurrency): a new request only when one finishes
    for _ in range(ns.concurrency or ns.requests):
        if requests:
            engine.add_request(*requests.pop())
    sizes: Counter[int] = Counter()
    seconds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    slowest: list[tuple[float, str]] = []
    decode_ms: list[float] = []  # wall ms of each decode step, in order (windows show drift over the run)
    n_compiles = len(_compiles)
    prof, profiling, prof_wall = None, False, 0.0
    history: deque[str] = deque(maxlen=12)  # the last steps, printed when a step fails
    t0 = time.perf_counter()
    done = steps = generated = 0
    while engine.has_unfinished_requests():
        if ns.profile_at and tag == "0" and steps in (ns.profile_at, ns.profile_at + PROFILE_STEPS):
            prof, profiling = _toggle_profile(engine, prof), not profiling
        sizes[engine.num_running] += 1
        start = time.perf_counter()
        try:
            outputs = engine.step()
        except Exception:
            _print_failure(engine, history)
            raise
        step = engine.last_step
        if step is not None:
            dt = time.perf_counter() - start
            if profiling:
                prof_wall += dt
            if step.is_decode:
                decode_ms.append(1e3 * dt)
            kind = f"decode B={len(step.scheduled)}" if step.is_decode else "mixed"
            history.append(f"{kind} ({step.num_tokens} tokens)")
            seconds[kind] += dt
            counts[kind] += 1
            generated += sum(e.sample for e in step.scheduled)
            detail = f"{kind}: {len(step.scheduled)} seqs, {step.num_tokens} tokens"
            slowest = sorted([*slowest, (dt, detail)], reverse=True)[:8]
        finished = sum(o.finished for o in outputs)
        done += finished
        for _ in range(finished if ns.concurrency else 0):
            if requests:
                engine.add_request(*requests.pop())
        steps += 1
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    print(
        f"== pass {tag}: {done}/{ns.requests} requests finished in {steps} steps, {wall:.1f} s, "
        f"{generated / wall:.1f} tok/s"
    )
    print("running sequences per step:", dict(sorted(sizes.items())))
    print(f"{'step kind':>14} {'steps':>6} {'seconds':>8} {'ms/step':>8}")
    for kind in sorted(seconds, key=lambda k: -seconds[k])[:12]:
        print(f"{kind:>14} {counts[kind]:6d} {seconds[kind]:8.2f} {1e3 * seconds[kind] / counts[kind]:8.2f}")
    window = 256
    means = [
        sum(decode_ms[i : i + window]) / len(decode_ms[i : i + window])
        for i in range(0, len(decode_ms), window)
    ]
    print(f"decode ms/step by window of {window} decode steps:", " ".join(f"{m:.2f}" for m in means))
    if prof is not None:
        rows = kernel_times(prof, PROFILE_STEPS)
        kernel_ms = sum(r[2] for r in rows) / 1e3
        print(
            f"profiled steps {ns.profile_at}..{ns.profile_at + PROFILE_STEPS - 1}: "
            f"{prof_wall * 1e3 / PROFILE_STEPS:.3f} ms wall, {kernel_ms:.3f} ms of kernels per step"
        )
        print_kernel_table(rows, kernel_ms, 16)
    print("slowest steps:", "; ".join(f"{1e3 * dt:.0f} ms {d}" for dt, d in slowest))
    new = _compiles[n_compiles:]
    print(f"new Triton kernel variants this pass: {len(new)}")
    for _, text in new[:40]:
        print("   ", text[:600])
    return done == ns.requests


def main() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, model_required=True)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", default="900,1100")
    parser.add_argument("--output-len", default="16,600")
    parser.add_argument(
        "--concurrency", type=int, default=0, help="keep this many requests in flight (0: add all at once)"
    )
    parser.add_argument("--passes", type=int, default=1, help="run the workload this many times in a row")
    parser.add_argument("--log-compiles", action="store_true", help="list Triton kernels compiled per pass")
    parser.add_argument(
        "--profile-at", type=int, default=0, help=f"profile {PROFILE_STEPS} steps of pass 0 from this step on"
    )
    ns = parser.parse_args()
    if ns.log_compiles:
        _log_compiles()
    engine = LLM.from_engine_args(engine_args_from(ns)).engine
    rng = random.Random(0)
    ok = all([_run_pass(engine, ns, rng, str(i)) for i in range(ns.passes)])
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
