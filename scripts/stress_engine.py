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
from collections import Counter

import torch

from hyserve import SamplingParams
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


def _run_pass(engine, ns, rng: random.Random, tag: str) -> bool:
    lo_p, hi_p = (int(v) for v in ns.prompt_len.split(","))
    lo_o, hi_o = (int(v) for v in ns.output_len.split(","))
    high = min(engine.config.vocab_size, 248044)
    for i in range(ns.requests):
        prompt = [rng.randrange(high) for _ in range(rng.randint(lo_p, hi_p))]
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(lo_o, hi_o), ignore_eos=True)
        engine.add_request(f"stress-{tag}-{i}", prompt, params)
    sizes: Counter[int] = Counter()
    seconds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    slowest: list[tuple[float, str]] = []
    n_compiles = len(_compiles)
    t0 = time.perf_counter()
    done = steps = generated = 0
    while engine.has_unfinished_requests():
        sizes[engine.num_running] += 1
        start = time.perf_counter()
        outputs = engine.step()
        step = engine.last_step
        if step is not None:
            dt = time.perf_counter() - start
            kind = f"decode B={len(step.scheduled)}" if step.is_decode else "mixed"
            seconds[kind] += dt
            counts[kind] += 1
            generated += sum(e.sample for e in step.scheduled)
            detail = f"{kind}: {len(step.scheduled)} seqs, {step.num_tokens} tokens"
            slowest = sorted([*slowest, (dt, detail)], reverse=True)[:8]
        done += sum(o.finished for o in outputs)
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
    parser.add_argument("--passes", type=int, default=1, help="run the workload this many times in a row")
    parser.add_argument("--log-compiles", action="store_true", help="list Triton kernels compiled per pass")
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
