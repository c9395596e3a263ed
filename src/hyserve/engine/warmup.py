"""Start-up warm-up: run one prefill per kernel-plan bucket so Triton compiles before the first request.

Triton compiles a kernel the first time it meets a new tile plan (the MoE plans change with the token
count: ``kernels/moe/configs``) or a new integer specialisation (a length divisible by 16 or not). On the
H200 that cost the first long prompt of a fresh server up to 2.5 s of time to first token. Here every
bucket up to the step budget is met once, with a length on each side of the divisibility rule, by
single-token requests through the normal engine path (scheduler, runner, sampler); their blocks and
state slots are freed when they finish. A last round prefills several prompts in one step and then
admits one while they decode, which is what every arriving request of a busy server costs: the
multi-sequence and mixed (decode rows + prefill chunk) cases of the kernels meet their shapes here. (The
kernels do not specialise on the sequence count, so one such step stands for all counts.) All of this runs
eagerly even when prefill graphs are captured (they serve only a lone prompt); each graph size is then
replayed once.
"""

from __future__ import annotations

import logging
import time

from hyserve.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


def warmup_lengths(max_tokens: int) -> list[int]:
    """Prompt lengths that cover the token buckets 16..max_tokens (powers of two), each once as a multiple
    of 16 and once not."""
    lengths, bucket = set(), 16
    while bucket <= max_tokens:
        lengths.add(bucket)
        lengths.add(bucket * 3 // 4 + 1)  # inside the bucket, not a multiple of 16
        bucket *= 2
    lengths.add(max_tokens)
    return sorted(x for x in lengths if 1 <= x <= max_tokens)


def warm_up(engine) -> None:
    """Run the warm-up prompts through ``engine`` (an idle ``LLMEngine``), one request at a time."""
    start = time.perf_counter()
    budget = min(engine.scheduler_config.max_num_batched_tokens, engine.max_model_len - 1)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    lengths = warmup_lengths(budget)
    # the eager prefill must meet every bucket even where prefill graphs will serve a lone prompt: it
    # still runs several prompts at once, chunks and mixed steps
    graphs, engine.runner.prefill_graphs = engine.runner.prefill_graphs, None
    try:
        for i, n in enumerate(lengths):
            _run(engine, f"warmup-{i}", n, params)
        _mixed_round(engine, budget)
    finally:
        engine.runner.prefill_graphs = graphs
    if graphs is not None:  # one replay of each captured size, now rather than on a first request
        for size in graphs.sizes:
            _run(engine, f"warmup-graph-{size}", size, params)
    log.info(
        "warm-up: %d prefill lengths up to %d tokens in %.1f s",
        len(lengths),
        budget,
        time.perf_counter() - start,
    )


def _run(engine, request_id: str, n: int, params: SamplingParams) -> None:
    engine.add_request(request_id, [0] * n, params)
    while engine.has_unfinished_requests():
        engine.step()


def _mixed_round(engine, budget: int) -> None:
    """Two prompts prefilled together, then a third admitted while they decode (a mixed step)."""
    seqs = max(1, engine.scheduler_config.max_num_seqs)
    lengths = [n for n in (37, 100, 300) if n <= budget][: min(3, seqs)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for i, n in enumerate(lengths[:2]):
        engine.add_request(f"warmup-mixed-{i}", [0] * n, params)
    engine.step()
    for n in lengths[2:]:
        engine.add_request("warmup-mixed-2", [0] * n, params)
    while engine.has_unfinished_requests():
        engine.step()
